"""Libpng's checks of a PNG file, made at export without TensorFlow.

TensorFlow decodes PNGs with libpng, which refuses files that the export's
decoders open: Pillow skips the critical chunks' CRCs, opens a file cut
before its IEND chunk and fills in rows missing from the image data, and
libspng (small PNGs) skips the zlib checksum. This module owns the checks
that close that gap, so that `encode` keeps no PNG that `tf.io.decode_png`
would refuse in some epoch:

- walking a PNG's chunks up to IEND (`png_header`): every critical chunk's
  CRC, no critical chunk libpng does not know, a complete file;
- its image data (`check_png_stream`): one zlib stream with a right
  checksum, inflated a piece at a time, holding exactly the image's rows
  (Adam7's passes when interlaced), each with a known filter type;
- whether those checks settle a PNG kept as it is (`png_stream_settled`),
  or TensorFlow's decoder must judge it at export (`decodable`).

This module imports no TensorFlow: it runs in export worker threads and
forked export worker processes.
"""

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from keras_datum import errors

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The critical chunks libpng knows; it refuses a PNG with any other.
_CRITICAL_CHUNKS = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND"})
# Samples per pixel of each PNG colour type.
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7's passes: (first column, first row, column step, row step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
          (1, 0, 2, 2), (0, 1, 1, 2))


@dataclass
class _PngHeader:
    width: int
    height: int
    bit_depth: int
    color_type: int
    interlace: int
    chunk_types: set
    image_data: list  # Views of the IDAT chunks' data: together, one zlib stream.


def png_header(data):
    """Walks a PNG's chunks up to IEND and checks them as libpng (TensorFlow's
    PNG decoder) does: every critical chunk's CRC, and a complete file.
    Pillow checks neither, so without this a file that TensorFlow cannot
    decode could pass validation.

    Returns:
        A `_PngHeader`: the IHDR fields, the chunk types seen and the image data.

    Raises:
        InvalidImageError: the file is truncated or a critical chunk is damaged.
    """
    position, end = len(PNG_SIGNATURE), len(data)
    view = memoryview(data)
    chunk_types, image_data, header = set(), [], None
    while True:
        if position + 12 > end:
            raise errors.InvalidImageError("truncated PNG (it ends before its IEND chunk)")
        length, chunk_type = struct.unpack_from(">I4s", data, position)
        after = position + 12 + length
        if after > end:
            raise errors.InvalidImageError(
                f"truncated PNG (its {chunk_type.decode('latin-1')} chunk runs past the end)"
            )
        # A chunk type starting with an upper-case letter is critical.
        critical = chunk_type[0] < 0x61
        if critical and chunk_type not in _CRITICAL_CHUNKS:
            # The PNG standard tells decoders to refuse a critical chunk they
            # do not know, and libpng does ("Failed to initialize decoder").
            raise errors.InvalidImageError(
                f"PNG with an unknown critical chunk {chunk_type.decode('latin-1')!r} "
                "(TensorFlow's decoder refuses it)"
            )
        if critical and zlib.crc32(view[position + 4 : after - 4]) != struct.unpack_from(
            ">I", data, after - 4
        )[0]:
            raise errors.InvalidImageError(
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
        raise errors.InvalidImageError("not a decodable image (PNG without a valid IHDR chunk)")
    return _PngHeader(*header, chunk_types, image_data)


def _png_row_bytes(png):
    """The length of each row of the image data, filter byte included, in
    stream order (Adam7's passes one after the other when interlaced)."""
    bits = _PNG_SAMPLES.get(png.color_type, 0) * png.bit_depth
    if not bits:
        raise errors.InvalidImageError(f"not a decodable image (PNG colour type {png.color_type})")
    passes = _ADAM7 if png.interlace else ((0, 0, 1, 1),)
    rows = []
    for left, top, step_x, step_y in passes:
        width = max(0, -(-(png.width - left) // step_x))
        height = max(0, -(-(png.height - top) // step_y))
        if width and height:  # An empty pass has no rows, not even filter bytes.
            rows += [1 + (width * bits + 7) // 8] * height
    return rows


def check_png_stream(png):
    """Checks a PNG's image data as libpng reads it: one zlib stream with a
    right checksum, exactly the image's rows, each with a known filter type.

    Pillow fills in rows missing from a short stream, and TensorFlow's
    decoder refuses such a file; libspng skips the checksum. With this
    check, the rows are what any decoder reads. The stream is inflated a
    piece at a time, so a huge image takes no more memory than a piece.

    Raises:
        InvalidImageError: the image data is damaged, short or too long.
    """
    rows = _png_row_bytes(png)
    need = sum(rows)
    # Where rows start: every `rows[0]` bytes, unless interlaced.
    starts = np.cumsum([0] + rows[:-1]) if png.interlace else rows[0] if rows else 1
    inflater = zlib.decompressobj()
    pending, seen = b"".join(png.image_data), 0
    try:
        while pending or seen == 0:
            piece = inflater.decompress(pending, _INFLATE_PIECE)
            pending = inflater.unconsumed_tail
            _check_filter_types(piece, seen, starts)
            seen += len(piece)
            if seen > need or not piece:
                break
        if seen <= need:
            rest = inflater.flush()  # Output zlib still holds once all input is in.
            _check_filter_types(rest, seen, starts)
            seen += len(rest)
    except zlib.error as e:
        raise errors.InvalidImageError(f"damaged PNG (its image data: {e})") from e
    size = f"its {png.width}x{png.height} pixels need {need} bytes"
    if seen > need:
        raise errors.InvalidImageError(f"damaged PNG (its image data holds more: {size})")
    if seen < need or not inflater.eof:
        raise errors.InvalidImageError(f"damaged PNG (its image data holds {seen} bytes: {size})")


# Image data inflated at a time by `check_png_stream`.
_INFLATE_PIECE = 4 << 20


def _check_filter_types(piece, offset, starts):
    """Raises if a row starting in `piece` (at `offset` in the stream) has
    a filter type byte over 4 (libpng: "bad adaptive filter value").
    `starts`: the rows' start offsets, or the row length when all rows
    have one (no interlace: a slice then, no NumPy for a tiny image)."""
    if isinstance(starts, int):
        first = -offset % starts
        bad = max(piece[first::starts], default=0) > 4
    else:
        inside = starts[(starts >= offset) & (starts < offset + len(piece))] - offset
        bad = len(inside) and np.frombuffer(piece, np.uint8)[inside].max() > 4
    if bad:
        raise errors.InvalidImageError("damaged PNG (a row has an unknown filter type)")


def png_stream_settled(png):
    """Whether a PNG's image data passes `check_png_stream` (and a palette
    image has its palette): then libpng reads it. When not, TensorFlow's
    decoder judges it at export (libpng reads some streams with extra data)."""
    if png.color_type == 3 and b"PLTE" not in png.chunk_types:
        return False
    try:
        check_png_stream(png)
    except errors.InvalidImageError:
        return False
    return True
