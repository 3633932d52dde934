"""Files that Pillow reads and TensorFlow's decoders refuse, written at test time."""

import io
import struct
import zlib

import numpy as np
from PIL import Image


def photo(size=(240, 320), seed=0):
    """A photo-like RGB array: a gradient with noise (entropy data to damage)."""
    rng = np.random.default_rng(seed)
    height, width = size
    ramp = np.linspace(0, 255, height * width * 3).reshape(height, width, 3)
    return (ramp + rng.normal(0, 30, ramp.shape)).clip(0, 255).astype(np.uint8)


def jpeg(pixels, **kwargs):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90, **kwargs)
    return buffer.getvalue()


def png(pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_missing_last_row(pixels):
    """A PNG whose image data holds every row but the last, checksums right."""
    height, width, channels = pixels.shape
    color_type = {1: 0, 3: 2, 4: 6}[channels]
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height - 1))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))


def png_with_critical_chunk(pixels):
    """A valid PNG with an unknown critical chunk (valid CRC) before IDAT."""
    data = png(pixels)
    at = data.index(b"IDAT") - 4
    return data[:at] + _chunk(b"XYZW", b"\x00\x01") + data[at:]


def marker_in_scan(data):
    """`data` with `FF E1` in the middle of its entropy-coded data."""
    scan = data.index(b"\xff\xda")
    start = scan + 2 + int.from_bytes(data[scan + 2 : scan + 4], "big")
    middle = (start + len(data)) // 2
    return data[:middle] + b"\xff\xe1" + data[middle + 2:]
