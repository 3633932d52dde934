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

PNGs are also checked as TensorFlow's decoder (libpng) checks them
(`png_check`): Pillow skips the critical chunks' CRCs and opens a file cut
before its IEND chunk, and libspng (small PNGs) skips the zlib checksum. So
no file passes validation that `tf.io.decode_png` would refuse in some epoch.

Memory: each export worker holds one image at a time, and an image whose
decode and conversion take more than `HUGE_IMAGE_BYTES` (estimated from its
header, before decoding) holds the one huge-image slot while it does, so at
most one such image is in memory across all workers (`huge_image_slot`).

This module imports no TensorFlow: it runs in export worker threads and
forked export worker processes.
"""

import contextlib
import io
import multiprocessing
import threading
from dataclasses import dataclass

import numpy as np
import simplejpeg
from PIL import Image

from keras_datum import errors
from keras_datum import png_check
from keras_datum import storage

try:
    import pyspng
except ImportError:  # No wheel for this platform: Pillow decodes every PNG.
    pyspng = None

# The rules by which the export validates images, recorded in its options:
# a cache validated by older rules is exported again, once, by itself.
# 2: every stored image decodes with TensorFlow's decoders (`decodable`).
VALIDATION_VERSION = 2
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
# JPEG coding processes (SOF markers) that TensorFlow's libjpeg decodes:
# baseline, extended and progressive Huffman. The others (lossless, and the
# arithmetic-coded ones) are decoded by Pillow and stored as PNG.
_TF_JPEG_PROCESSES = frozenset({0xC0, 0xC1, 0xC2})
_LOSSLESS_JPEG_PROCESSES = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
# What turns an image with each EXIF orientation upright (as
# `ImageOps.exif_transpose`, for images decoded by simplejpeg too).
_TRANSPOSES = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# An image whose decode and conversion take more than this holds the
# huge-image slot (`huge_image_slot`) while they do, so the export's workers
# hold at most one at a time. 256 MiB is a 30-megapixel JPEG turned
# upright, a 53-megapixel RGB PNG shrunk; a 12,000 x 12,000 image, just under
# Pillow's decompression-bomb limit, takes 0.55 GiB (RGB PNG) to 2.1 GiB
# (WebP). Below it images decode side by side: a folder of 20-megapixel PNGs
# still uses every core.
HUGE_IMAGE_BYTES = 256 * 2**20
# Peak bytes per decoded pixel of `encode_image` (the decode, any turn and
# conversion, the shrink and the re-encode), by Pillow's format and mode:
# ru_maxrss of one call on a 6,000 x 6,000 image, less what it held before,
# plus 1 for margin. RGB(A) pixels take 4 bytes in Pillow: a PNG shrunk takes 4 (RGB),
# 8 (RGBA, premultiplied to shrink), 5 (P or 1 -> RGB), 9 (P with
# transparency -> RGBA), 12 (16-bit gray through float64); a JPEG is decoded
# to 3-byte rows by libjpeg, then copied into Pillow and turned (8; CMYK 12).
# A JPEG over the cap counts the pixels of its reduced decode only
# (`_Opened.dct_scale`). Any other (WebP 16, TIFF, BMP, GIF): the most
# measured, a float TIFF's 20.
_PEAK_BYTES_PER_PIXEL = {
    ("PNG", "1"): 6, ("PNG", "L"): 2, ("PNG", "LA"): 9, ("PNG", "P"): 10,
    ("PNG", "RGB"): 5, ("PNG", "RGBA"): 9, ("PNG", "I;16"): 13,
    ("JPEG", "L"): 3, ("JPEG", "RGB"): 9, ("JPEG", "CMYK"): 13,
}
_MOST_PEAK_BYTES_PER_PIXEL = 21
# The huge-image slot of this process's threads; `shared_huge_image_slot`
# swaps in one that forked workers share.
_huge_slot = threading.Semaphore(1)


@dataclass
class EncodedImage:
    data: bytes
    format: str  # "jpeg" or "png"
    height: int
    width: int
    source_size: tuple  # (height, width) of the upright source image.
    pixels: bytes = b""  # Raw uint8 pixels (row-major), for small lossless images.
    channels: int = 0  # Channels of `pixels` (1 or 3); 0 when there are none.
    # Whether the checks here settle that TensorFlow's decoders read `data`;
    # when not, the export decodes it with them (`decodable`).
    settled: bool = True


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
        # In place: one float copy of the image, not four (huge scans).
        array *= 255.0 / peak
        np.clip(array, 0, 255, out=array)
        np.round(array, out=array)
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
    png_check.check_png_stream(png)
    try:
        pixels = pyspng.load(data)
    except Exception as e:  # pyspng's RuntimeError for bad data.
        raise errors.InvalidImageError(f"not a decodable image ({type(e).__name__}: {e})") from e
    size = (png.height, png.width)
    return EncodedImage(data, "png", *size, size, pixels.tobytes(), channels)


def _jpeg_process(data):
    """The SOF marker of a JPEG (0xC0 for baseline), or `None` if the
    markers end before one: Pillow then says what is wrong."""
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # Fill byte.
            position += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return marker
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        position += 2 + length
    return None


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

    A file stored as it is (a JPEG, a PNG) must decode with TensorFlow's
    decoders, which the read path uses and which refuse files that Pillow
    reads (a marker inside a JPEG's scan data, a PNG with rows missing). A
    check at least as strict settles it here: a strict libjpeg decode at
    1/8 scale, libpng's checks of a PNG's image data
    (`png_check.check_png_stream`). An image it does not settle
    (`EncodedImage.settled`) is decoded by TensorFlow once its shard is
    written (see `decodable`). Small PNGs, whose raw pixels are stored
    too, are decoded here. Converted images are decoded here, strictly
    for JPEGs (`_strict_jpeg`).

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
        raise errors.InvalidImageError(f"cannot read file: {e.strerror or e}") from e
    if not data:
        raise errors.InvalidImageError("empty file (0 bytes)")
    png = None
    if data.startswith(png_check.PNG_SIGNATURE):
        png = png_check.png_header(data)
        small = _small_png(data, png, max_side)
        if small is not None:
            return small
    with _pillow_errors():
        opened = _open(data, png, max_side)
    # Only images whose decode is huge wait for the slot: the others pay
    # nothing beyond the header Pillow has already read.
    with huge_image_slot(_peak_bytes(opened)):
        with _pillow_errors():
            _decode(data, opened, png)
        if opened.keep:
            return _kept(data, opened, png)
        return _converted(opened, max_side)


@contextlib.contextmanager
def _pillow_errors():
    """Pillow's errors for a bad file as `InvalidImageError`."""
    try:
        yield
    except Image.DecompressionBombError as e:
        raise errors.InvalidImageError(f"decompression bomb refused: {e}") from e
    except Image.UnidentifiedImageError as e:
        raise errors.InvalidImageError("not an image file (unknown format)") from e
    except errors.InvalidImageError:
        raise
    except Exception as e:  # Pillow raises many types for bad data.
        raise errors.InvalidImageError(
            f"not a decodable image ({type(e).__name__}: {e})"
        ) from e


@contextlib.contextmanager
def huge_image_slot(peak_bytes):
    """Holds the huge-image slot while an image that takes more than
    `HUGE_IMAGE_BYTES` is decoded and converted; others pass at once.

    The slot is one for the whole process (every export thread), and one
    for all the workers that `shared_huge_image_slot` forks.
    """
    if peak_bytes <= HUGE_IMAGE_BYTES:
        yield
        return
    slot = _huge_slot  # Released to the one acquired, should the slot be swapped meanwhile.
    with slot:
        yield


@contextlib.contextmanager
def shared_huge_image_slot():
    """Within this block, the huge-image slot is one that processes forked
    (by a `fork` context's Pool) inherit and share.

    A fresh one for each block: a worker killed while it holds the slot (an
    export stopped by an invalid file) cannot leave the next export waiting.
    """
    global _huge_slot
    previous = _huge_slot
    _huge_slot = multiprocessing.get_context("fork").Semaphore(1)
    try:
        yield
    finally:
        _huge_slot = previous


def _peak_bytes(opened):
    """The most memory decoding and converting `opened` takes, from its
    header (see `_PEAK_BYTES_PER_PIXEL`); 0 for a file stored undecoded."""
    if opened.keep:
        return 0  # Undecoded, or a small PNG's raw pixels (`RAW_MAX_PIXELS`).
    width, height = opened.image.size
    pixels = -(-width // opened.dct_scale) * -(-height // opened.dct_scale)
    per_pixel = _PEAK_BYTES_PER_PIXEL.get((opened.format, opened.image.mode))
    return pixels * (per_pixel or _MOST_PEAK_BYTES_PER_PIXEL)


@dataclass
class _Opened:
    """A source image opened by Pillow, and what the export does with it."""

    image: Image.Image
    format: str  # Pillow's: "JPEG", "PNG", "WEBP", ...
    source_size: tuple  # (height, width), upright.
    orientation: int  # EXIF's (1: upright).
    keep: bool  # Stored as it is.
    too_big: bool  # Over the cap: shrunk.
    lossless: bool  # A lossless JPEG: converted to PNG.
    dct_scale: int  # A converted JPEG over the cap is decoded at 1/dct_scale.


def _open(data, png, max_side):
    """Opens `data` with Pillow, reading its header only, and decides what
    the export does with it."""
    image = Image.open(io.BytesIO(data))
    source_format = image.format
    # Reading EXIF costs as much as decoding a tiny PNG; PNGs without an
    # eXIf chunk (nearly all) have no orientation to apply.
    has_exif = source_format != "PNG" or "exif" in image.info
    orientation = image.getexif().get(_EXIF_ORIENTATION, 1) if has_exif else 1
    width, height = image.size
    process = _jpeg_process(data) if source_format == "JPEG" else None
    # Images only a little over the cap keep their bytes: re-encoding
    # costs more at export than the slightly larger decode costs later.
    too_big = _over_cap(width, height, max_side)
    keep = orientation in (1, None) and not too_big and (
        source_format == "PNG"
        or (source_format == "JPEG" and image.mode in ("L", "RGB")
            and process in _TF_JPEG_PROCESSES)
    )
    lossless = process in _LOSSLESS_JPEG_PROCESSES
    dct_scale = 1
    if source_format == "JPEG" and too_big and not lossless:
        scale = _cap_scale(width, height, max_side)
        dct_scale = _draft_scale(width, height, (int(width * scale) + 1, int(height * scale) + 1))
    return _Opened(image, source_format, _upright_size(image, orientation), orientation,
                   keep, too_big, lossless, dct_scale)


def _decode(data, opened, png):
    """Decodes `opened` where the export needs its pixels: to convert it,
    or for the raw pixels of a small PNG."""
    if opened.format == "JPEG" and not opened.keep and not opened.lossless:
        opened.image = _strict_jpeg(data, opened.image, opened.dct_scale)
    elif not opened.keep or (png is not None and _raw_sized(opened.image)):
        opened.image.load()  # Decodes every block: this is Pillow's validation.


def _draft_scale(width, height, requested):
    """The DCT scale (1, 2, 4 or 8) Pillow's `draft` decodes a JPEG at for
    a `requested` (width, height): the largest that keeps it at least that big."""
    ratio = min(width // requested[0], height // requested[1])
    return next(scale for scale in (8, 4, 2, 1) if ratio >= scale)


def _strict_jpeg(data, image, scale):
    """Decodes a JPEG the export converts (over the cap, turned upright, or
    CMYK), refusing one that libjpeg warns about.

    Pillow ignores libjpeg's warnings ("Corrupt JPEG data: premature end of
    data segment"): it would store a damaged image, its missing blocks
    filled in, as a clean one. simplejpeg's strict decode (the same
    libjpeg-turbo) raises on them. Gray and RGB JPEGs are decoded by it at
    1/`scale`, the scale Pillow's `draft` would choose (the same pixels: both
    are libjpeg-turbo's default decoder); CMYK ones are checked by it at 1/8
    scale, then decoded by Pillow, which converts CMYK as Photoshop writes it.
    """
    width, height = image.size
    plain = image.mode in ("L", "RGB")
    try:
        pixels = simplejpeg.decode_jpeg(
            data,
            colorspace={"L": "GRAY", "RGB": "RGB"}.get(image.mode, "CMYK"),
            # simplejpeg ignores `min_factor` without a minimum size: 1 x 1
            # lets it decode a CMYK check at 1/8 scale (full size took 4
            # bytes a pixel).
            min_width=-(-width // scale) if plain else 1,
            min_height=-(-height // scale) if plain else 1,
            min_factor=1 if plain else 8,
            strict=True,
        )
    except ValueError as e:
        raise errors.InvalidImageError(f"damaged JPEG (libjpeg: {e})") from e
    if not plain:
        if scale > 1:
            image.draft(image.mode, (-(-width // scale), -(-height // scale)))
        image.load()
        return image
    return Image.fromarray(pixels[..., 0] if image.mode == "L" else pixels, image.mode)


def _raw_sized(image):
    return image.width * image.height <= RAW_MAX_PIXELS


def _kept(data, opened, png):
    """The `EncodedImage` of a file stored as it is, settled when the checks
    here pass (see `_strict_jpeg_decodes`, `png_check.check_png_stream`)."""
    image = opened.image
    raw = (b"", 0)
    if png is None:
        settled = _strict_jpeg_decodes(data)
    else:
        raw = _raw_pixels(image)
        if raw[1]:  # Raw pixels are read back: the stream must be exact.
            png_check.check_png_stream(png)
            settled = True
        else:
            settled = png_check.png_stream_settled(png)
    return EncodedImage(data, opened.format.lower(), image.height, image.width,
                        opened.source_size, *raw, settled=settled)


def _strict_jpeg_decodes(data):
    """Whether libjpeg-turbo decodes a JPEG without a warning (simplejpeg's
    strict mode, at 1/8 scale: every block is still entropy-decoded).

    TensorFlow's decoder (the same libjpeg) refuses a file with some of
    libjpeg's warnings and reads others: one that decodes strictly, it
    reads (`tests/test_decodable.py` fuzzes that). One that does not is
    left to TensorFlow's own decoder to judge, at export.
    """
    try:
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_width=1, min_height=1,
                               min_factor=8, strict=True)
    except ValueError:
        return False
    return True


def _converted(opened, max_side):
    """The `EncodedImage` of a file converted (turned upright, shrunk to the
    cap, or in a format TensorFlow does not read)."""
    image, source_size = opened.image, opened.source_size
    upright = image
    if opened.orientation in _TRANSPOSES:
        upright = image.transpose(_TRANSPOSES[opened.orientation])
    jpeg = opened.format == "JPEG" and not opened.lossless
    if opened.format == "JPEG":
        if upright.mode not in ("L", "RGB"):  # Converting to its own mode copies it.
            upright = upright.convert("RGB")
    else:
        upright = _to_storable(upright)
    if opened.too_big:
        if upright.mode in ("P", "1"):
            upright = upright.convert("RGBA" if "transparency" in upright.info else "RGB")
        # From the source's size: a JPEG was decoded at a reduced size (draft).
        scale = _cap_scale(source_size[1], source_size[0], max_side)
        size = (max(1, round(source_size[1] * scale)), max(1, round(source_size[0] * scale)))
        upright = upright.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    fmt = "jpeg" if jpeg else "png"
    raw = _raw_pixels(upright) if fmt == "png" else (b"", 0)
    return EncodedImage(
        _save(upright, fmt), fmt, upright.height, upright.width, source_size, *raw
    )
