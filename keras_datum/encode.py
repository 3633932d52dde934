"""Validating one source image and choosing the bytes that get stored.

Every image is decoded once, here, at export. The original encoded bytes are
kept whenever TensorFlow's `tf.io.decode_image` will read them back exactly as
Pillow saw them (JPEG in grayscale or RGB, and PNG). Everything else is
converted once, so that the read path never meets a format it cannot decode:

- WebP, TIFF, BMP and GIF become PNG (GIF keeps its first frame, which is
  also what Keras shows).
- CMYK and YCCK JPEGs become RGB JPEGs (quality 95).
- A JPEG with an EXIF orientation tag is turned upright and re-encoded as a
  JPEG (quality 95), because TensorFlow ignores EXIF.
- An image whose longer side exceeds the export's `max_side` is shrunk to it
  (JPEG stays JPEG, quality 95; anything else becomes PNG). Decoding a 12 MP
  photo in every epoch to resize it to 224 pixels is the single biggest waste
  an input pipeline can have; the cap does that work once.

PNGs are also checked as TensorFlow's decoder (libpng) checks them: Pillow
skips the critical chunks' CRCs and opens a file cut before its IEND chunk,
and libspng (small PNGs) skips the zlib checksum. So no file passes
validation that `tf.io.decode_png` would refuse in some epoch.

This module imports no TensorFlow: it runs in export worker threads.
"""

import io
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image
from PIL import ImageOps

from keras_datum import storage

try:
    import pyspng
except ImportError:  # No wheel for this platform: Pillow decodes every PNG.
    pyspng = None

# Re-encoded JPEGs: high enough that re-encoding is not a visible loss.
JPEG_QUALITY = 95
# An image is shrunk to `max_side` only when its longer side is more than
# this factor over it (see `encode_image`).
CAP_SLACK = 1.25
_EXIF_ORIENTATION = 0x0112
_PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")
# Lossless images this small (32 x 32, 64 x 64) also get their raw pixels
# stored: reading them back is a copy instead of a PNG decode, which is most
# of the cost of a tiny image. The PNG stays too (for TFDS, for color modes
# the raw pixels cannot give exactly), so storage grows by about the pixels.
RAW_MAX_PIXELS = 64 * 64
_RAW_MODES = {"L": 1, "RGB": 3}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# 8-bit PNG colour types that Pillow opens as "L" and "RGB": small ones are
# decoded by libspng (`_small_png`), with the same pixels at about half the
# cost of Pillow's Python-side chunk handling.
_SIMPLE_PNG_CHANNELS = {0: 1, 2: 3}
# Chunks that change no pixel (Pillow, libspng and TensorFlow all ignore
# them). A PNG with any other (transparency, EXIF, animation) goes to Pillow.
_PIXEL_NEUTRAL_CHUNKS = frozenset(
    {b"IHDR", b"IDAT", b"IEND", b"gAMA", b"cHRM", b"sRGB", b"iCCP", b"sBIT", b"pHYs",
     b"tEXt", b"zTXt", b"iTXt", b"tIME", b"bKGD"}
)


@dataclass
class _PngHeader:
    width: int
    height: int
    bit_depth: int
    color_type: int
    interlace: int
    chunk_types: set
    image_data: list  # Views of the IDAT chunks' data: together, one zlib stream.


class InvalidExampleError(ValueError):
    """A source example that cannot be used; the message says why."""


class InvalidImageError(InvalidExampleError):
    """A source file that cannot be used as an image; the message says why."""


@dataclass
class EncodedImage:
    data: bytes
    format: str  # "jpeg" or "png"
    height: int
    width: int
    source_size: tuple  # (height, width) of the upright source image.
    pixels: bytes = b""  # Raw uint8 pixels (row-major), for small lossless images.
    channels: int = 0  # Channels of `pixels` (1 or 3); 0 when there are none.


def _raw_pixels(image):
    """`(bytes, channels)` of a small grayscale or RGB image, else `(b"", 0)`."""
    if image.mode in _RAW_MODES and image.width * image.height <= RAW_MAX_PIXELS:
        return image.tobytes(), _RAW_MODES[image.mode]
    return b"", 0


def _to_storable(image):
    """Returns an image in a mode that PNG stores and TensorFlow decodes."""
    if image.mode in _PNG_MODES:
        return image
    if image.mode.startswith("I;16") or image.mode in ("I", "F"):
        # 16- and 32-bit grayscale to 8 bits by one fixed scale, the same
        # for every image (never each image's own maximum, which would store
        # one source value differently in each): integers as 16-bit values
        # (0..65535), as TF decodes 16-bit PNGs; floats as [0, 1], as
        # `tf.image.convert_image_dtype` reads them. Beyond: clipped.
        array = np.asarray(image, dtype=np.float64)
        peak = 1.0 if image.mode == "F" else 65535.0
        array = np.clip(array * (255.0 / peak), 0, 255).round()
        return Image.fromarray(array.astype(np.uint8), mode="L")
    if "A" in image.mode:
        return image.convert("RGBA")
    return image.convert("RGB")


def _save(image, format):
    buffer = io.BytesIO()
    if format == "jpeg":
        image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


def _png_header(data):
    """Walks a PNG's chunks up to IEND and checks them as libpng (TensorFlow's
    PNG decoder) does: every critical chunk's CRC, and a complete file.
    Pillow checks neither, so without this a file that TensorFlow cannot
    decode could pass validation.

    Returns:
        A `_PngHeader`: the IHDR fields, the chunk types seen and the image data.

    Raises:
        InvalidImageError: the file is truncated or a critical chunk is damaged.
    """
    position, end = len(_PNG_SIGNATURE), len(data)
    view = memoryview(data)
    chunk_types, image_data, header = set(), [], None
    while True:
        if position + 12 > end:
            raise InvalidImageError("truncated PNG (it ends before its IEND chunk)")
        length, chunk_type = struct.unpack_from(">I4s", data, position)
        after = position + 12 + length
        if after > end:
            raise InvalidImageError(
                f"truncated PNG (its {chunk_type.decode('latin-1')} chunk runs past the end)"
            )
        # A chunk type starting with an upper-case letter is critical.
        critical = chunk_type[0] < 0x61
        if critical and zlib.crc32(view[position + 4 : after - 4]) != struct.unpack_from(
            ">I", data, after - 4
        )[0]:
            raise InvalidImageError(
                f"damaged PNG (CRC mismatch in its {chunk_type.decode('latin-1')} chunk)"
            )
        chunk_types.add(chunk_type)
        if chunk_type == b"IHDR" and length == 13:
            header = struct.unpack_from(">IIBBxxB", data, position + 8)
        elif chunk_type == b"IDAT":
            image_data.append(view[position + 8 : after - 4])
        elif chunk_type == b"IEND":
            break
        position = after
    if header is None:
        raise InvalidImageError("not a decodable image (PNG without a valid IHDR chunk)")
    return _PngHeader(*header, chunk_types, image_data)


def _small_png(data, png, max_side):
    """The `EncodedImage` of a small 8-bit gray or RGB PNG, decoded by
    libspng; `None` when Pillow must decode it (other kinds, or no pyspng).

    libspng does not check the zlib stream's own checksum (Adler-32), which
    libpng does: decompressing the stream here checks it, and that the
    stream holds exactly the image's rows.
    """
    channels = _SIMPLE_PNG_CHANNELS.get(png.color_type)
    if (
        pyspng is None
        or channels is None
        or png.bit_depth != 8
        or png.interlace
        or not png.chunk_types <= _PIXEL_NEUTRAL_CHUNKS
        or png.width * png.height > RAW_MAX_PIXELS
        # Pillow's decompression-bomb limit (warning or error) stays Pillow's.
        or (Image.MAX_IMAGE_PIXELS and png.width * png.height > Image.MAX_IMAGE_PIXELS)
        or _over_cap(png.width, png.height, max_side)
    ):
        return None
    try:
        rows = zlib.decompress(b"".join(png.image_data))
        if len(rows) != png.height * (1 + png.width * channels):
            return None  # Let Pillow judge a stream of the wrong length.
        pixels = pyspng.load(data)
    except Exception as e:  # zlib.error, and pyspng's RuntimeError for bad data.
        raise InvalidImageError(f"not a decodable image ({type(e).__name__}: {e})") from e
    size = (png.height, png.width)
    return EncodedImage(data, "png", *size, size, pixels.tobytes(), channels)


def min_short_side(max_side):
    """The shorter side a cap of `max_side` never shrinks an image below.

    Shrinking only the longer side to the cap would leave a panorama (or
    a tall scan) with a few pixels across; half the cap keeps at least
    `max(image_size)` of them under the default cap, `2 * max(image_size)`.
    """
    return None if not max_side else max_side // 2


def _cap_scale(width, height, max_side):
    """The factor the cap shrinks an image by: its longer side goes to
    `max_side`, unless that takes its shorter side below `min_short_side`."""
    return max(max_side / max(width, height), min_short_side(max_side) / min(width, height))


def _over_cap(width, height, max_side):
    """Whether an image is shrunk by the cap: only one more than
    `CAP_SLACK` over its shrunk size is."""
    return bool(max_side) and _cap_scale(width, height, max_side) * CAP_SLACK < 1


def _upright_size(image, orientation):
    width, height = image.size
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def encode_image(path, max_side=None):
    """Reads, validates and, where needed, converts one image file.

    JPEGs that are kept as they are are decoded at 1/8 scale (DCT scaling):
    every entropy-coded block is still read and checked, so a truncated or
    corrupt file is caught, at a fraction of the cost of a full decode.
    PNGs get libpng's checks first (`_png_header`), and small plain ones are
    decoded by libspng (`_small_png`).

    Args:
        path: the image file.
        max_side: when the upright image's longer side exceeds this by more
            than `CAP_SLACK` (25%), it is shrunk to it (aspect kept; the
            shorter side never below `min_short_side`) and re-encoded: JPEG
            sources as JPEG (quality 95), others as PNG. `None` keeps every
            size.

    Returns:
        An `EncodedImage` with the bytes to store, their format, the stored
        height and width, and the upright source height and width.

    Raises:
        InvalidImageError: the file is empty, unreadable, truncated, not an
            image, or over Pillow's decompression-bomb limit.
    """
    try:
        data = storage.read_bytes(path)
    except OSError as e:
        raise InvalidImageError(f"cannot read file: {e.strerror or e}") from e
    if not data:
        raise InvalidImageError("empty file (0 bytes)")
    if data.startswith(_PNG_SIGNATURE):
        png = _png_header(data)
        small = _small_png(data, png, max_side)
        if small is not None:
            return small
    try:
        image = Image.open(io.BytesIO(data))
        source_format = image.format
        # Reading EXIF costs as much as decoding a tiny PNG; PNGs without an
        # eXIf chunk (nearly all) have no orientation to apply.
        has_exif = source_format != "PNG" or "exif" in image.info
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1) if has_exif else 1
        source_size = _upright_size(image, orientation)
        width, height = image.size
        # Images only a little over the cap keep their bytes: re-encoding
        # costs more at export than the slightly larger decode costs later.
        too_big = _over_cap(width, height, max_side)
        keep = orientation in (1, None) and not too_big and (
            source_format == "PNG"
            or (source_format == "JPEG" and image.mode in ("L", "RGB"))
        )
        if source_format == "JPEG":
            if keep:
                image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
            elif too_big:
                scale = _cap_scale(width, height, max_side)
                image.draft(image.mode, (int(width * scale) + 1, int(height * scale) + 1))
        image.load()  # Decodes every block: this is the validation.
    except Image.DecompressionBombError as e:
        raise InvalidImageError(f"decompression bomb refused: {e}") from e
    except Image.UnidentifiedImageError as e:
        raise InvalidImageError("not an image file (unknown format)") from e
    except Exception as e:  # Pillow raises many types for bad data.
        raise InvalidImageError(
            f"not a decodable image ({type(e).__name__}: {e})"
        ) from e

    if keep:
        fmt = source_format.lower()
        raw = _raw_pixels(image) if fmt == "png" else (b"", 0)
        return EncodedImage(data, fmt, height, width, source_size, *raw)
    upright = ImageOps.exif_transpose(image)
    if source_format == "JPEG":
        upright = upright.convert("L" if upright.mode == "L" else "RGB")
    else:
        upright = _to_storable(upright)
    if too_big:
        if upright.mode in ("P", "1"):
            upright = upright.convert("RGBA" if "transparency" in upright.info else "RGB")
        # From the source's size: a JPEG was decoded at a reduced size (draft).
        scale = _cap_scale(width, height, max_side)
        size = (max(1, round(source_size[1] * scale)), max(1, round(source_size[0] * scale)))
        upright = upright.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    fmt = "jpeg" if source_format == "JPEG" else "png"
    raw = _raw_pixels(upright) if fmt == "png" else (b"", 0)
    return EncodedImage(
        _save(upright, fmt), fmt, upright.height, upright.width, source_size, *raw
    )
