"""Validation and conversion of source images, and how bad files are handled."""

import io
import json
import os
import zlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import make_class_folders
from PIL import Image
from helpers import read_split

from keras_datum import DatumDataset
from keras_datum import InvalidImageError
from keras_datum import decodable
from keras_datum.encode import encode_image


def _validated(path, max_side=None):
    """What the export does with one file: `encode_image`, then TensorFlow's
    check of the stored bytes (`decodable`), which it makes once the shard
    is written."""
    encoded = encode_image(path, max_side)
    reason = None
    if not encoded.settled:
        reason = decodable.image_refusal(encoded.data, encoded.format)
    if reason:
        raise InvalidImageError(reason)
    return encoded


def _decode(encoded, channels=0):
    return tf.io.decode_image(encoded.data, channels=channels, expand_animations=False).numpy()


def _gradient(size=(12, 20)):
    y, x = np.mgrid[0 : size[0], 0 : size[1]]
    return np.stack([x * 10, y * 20, (x + y) * 5], axis=-1).astype(np.uint8)


def test_png_and_jpeg_keep_their_original_bytes(tmp_path):
    for fmt in ("PNG", "JPEG"):
        path = tmp_path / f"x.{fmt.lower()}"
        Image.fromarray(_gradient()).save(path, format=fmt)
        encoded = encode_image(str(path))
        assert encoded.data == path.read_bytes()
        assert (encoded.height, encoded.width) == (12, 20)


@pytest.mark.parametrize("fmt, ext", [("WEBP", "webp"), ("TIFF", "tiff"), ("BMP", "bmp")])
def test_formats_tensorflow_cannot_read_become_lossless_png(tmp_path, fmt, ext):
    path = tmp_path / f"x.{ext}"
    pixels = _gradient()
    Image.fromarray(pixels).save(path, format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    encoded = encode_image(str(path))
    assert encoded.format == "png" and encoded.data != path.read_bytes()
    np.testing.assert_array_equal(_decode(encoded), pixels)


def test_cmyk_jpeg_becomes_rgb(tmp_path):
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (8, 6), (0, 255, 255, 0)).save(path)  # Pure red in CMYK.
    encoded = encode_image(str(path))
    assert encoded.format == "jpeg" and encoded.data != path.read_bytes()
    pixels = _decode(encoded)
    assert pixels.shape == (6, 8, 3)
    assert pixels[..., 0].mean() > 200 and pixels[..., 1].mean() < 60


def test_exif_rotated_jpeg_comes_out_upright(tmp_path):
    # Stored 20 wide x 10 high with orientation 6 (rotate 90° clockwise to
    # view): upright it is 10 wide x 20 high. The stored left half is white,
    # so upright the top half is white.
    stored = np.zeros((10, 20, 3), np.uint8)
    stored[:, :10] = 255
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    image.save(path, exif=exif.tobytes(), quality=100)
    encoded = encode_image(str(path))
    assert (encoded.height, encoded.width) == (20, 10)
    pixels = _decode(encoded)
    assert pixels.shape == (20, 10, 3)
    assert pixels[:8].mean() > 240 and pixels[12:].mean() < 15


def test_animated_gif_keeps_the_first_frame(tmp_path):
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    pixels = _decode(encode_image(str(path)), channels=3)
    assert pixels.shape == (8, 8, 3)
    assert pixels[..., 0].min() > 200 and pixels[..., 2].max() < 50


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16"])
def test_png_modes_decode_in_tensorflow(tmp_path, mode):
    path = tmp_path / "x.png"
    if mode == "I;16":
        array = (np.arange(48, dtype=np.uint16).reshape(6, 8) * 1000)
        Image.fromarray(array).save(path)
        expected = (array >> 8).astype(np.uint8)
    else:
        Image.fromarray(_gradient((6, 8))).convert(mode).save(path)
        expected = None
    pixels = _decode(encode_image(str(path)), channels=3)
    assert pixels.shape == (6, 8, 3)
    if expected is not None:
        np.testing.assert_allclose(pixels[..., 0], expected, atol=1)


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("empty.jpg", b"", "empty file"),
        ("text.jpg", b"this is not a jpeg", "not an image file"),
        ("truncated.jpg", "truncated", "decoder refuses it"),
    ],
)
def test_bad_files_are_invalid_with_a_reason(tmp_path, name, content, reason):
    if content == "truncated":
        buffer = io.BytesIO()
        Image.fromarray(_gradient((64, 64))).save(buffer, format="JPEG")
        content = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InvalidImageError, match=reason):
        _validated(str(path))


def test_decompression_bomb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    path = tmp_path / "bomb.png"
    Image.new("L", (100, 100)).save(path)  # 10,000 pixels: over twice the limit.
    with pytest.raises(InvalidImageError, match="decompression bomb refused"):
        encode_image(str(path))


def _zoo(root):
    """A class folder dataset with good images and one of each bad kind."""
    make_class_folders(root, {"a": 6, "b": 6})
    (root / "a" / "empty.jpg").write_bytes(b"")
    (root / "a" / "text.jpg").write_text("hello")
    (root / "b" / "spaces and ünïcødé.png").write_bytes((root / "b" / "000.png").read_bytes())
    Image.new("RGB", (9, 9), (0, 255, 0)).save(root / "b" / "extra.webp")
    return str(root)


def test_dataset_skips_and_reports_invalid_files(tmp_path):
    root = _zoo(tmp_path / "src")
    ds = DatumDataset(root, validation_split=None, verbose=False)
    with pytest.warns(UserWarning, match=r"2 invalid files were left out .*invalid_files.json"):
        meta = ds.export()
    assert meta["invalid_files"]["count"] == 2
    with open(os.path.join(ds.cache_dir, "invalid_files.json")) as f:
        report = json.load(f)
    assert sorted((r["file"], r["reason"][:5]) for r in report) == [
        ("a/empty.jpg", "empty"),
        ("a/text.jpg", "not a"),
    ]
    names = {name for name, _, _ in read_split(ds, "train")}
    assert "b/spaces and ünïcødé.png" in names and "b/extra.webp" in names
    assert len(names) == 14
    # Every remaining example trains: decoding the whole split cannot fail.
    assert sum(1 for _ in ds.train().unbatch()) == 14


def test_on_invalid_raise_names_the_file_and_leaves_no_cache(tmp_path):
    root = _zoo(tmp_path / "src")
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(root, cache_dir=cache_dir, on_invalid="raise", verbose=False)
    with pytest.raises(InvalidImageError, match=r"Invalid example .*a/(empty|text).jpg"):
        ds.export()
    assert not cache_dir.exists()
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith("cache")]
    assert leftovers == ["cache.lock"]


def test_reusing_a_cache_with_invalid_files_under_raise(tmp_path):
    root = _zoo(tmp_path / "src")
    with pytest.warns(UserWarning):
        DatumDataset(root, verbose=False).export()
    with pytest.raises(ValueError, match="left out 2 invalid files .* on_invalid='raise'"):
        DatumDataset(root, on_invalid="raise", verbose=False).export()


def test_small_lossless_images_store_raw_pixels_that_read_back_exactly(tmp_path):
    rng = np.random.default_rng(7)
    sources = {
        "gray": Image.fromarray(rng.integers(0, 256, (12, 10), dtype=np.uint8), mode="L"),
        "rgb": Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)),
        "rgba": Image.fromarray(rng.integers(0, 256, (12, 10, 4), dtype=np.uint8)),
        "palette": Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).quantize(16),
    }
    originals = {}
    for name, image in sources.items():
        os.makedirs(tmp_path / "src" / name)
        path = tmp_path / "src" / name / "0.png"
        image.save(path)
        originals[name] = path.read_bytes()
    # Large and lossy images keep only their encoded bytes.
    big = encode_image(_save_png(tmp_path / "big.png", rng.integers(0, 256, (80, 80, 3), dtype=np.uint8)))
    assert (big.pixels, big.channels) == (b"", 0)
    jpeg_path = tmp_path / "small.jpg"
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(jpeg_path)
    assert encode_image(str(jpeg_path)).channels == 0
    assert encode_image(str(tmp_path / "src" / "rgb" / "0.png")).channels == 3
    assert encode_image(str(tmp_path / "src" / "gray" / "0.png")).channels == 1

    for color_mode, channels in (("grayscale", 1), ("rgb", 3), ("rgba", 4)):
        ds = DatumDataset(
            tmp_path / "src", image_size=(12, 10), color_mode=color_mode,
            validation_split=None, cache_dir=tmp_path / "cache", verbose=False,
        )
        got = {
            ds.class_names[int(y)]: np.asarray(x)
            for x, y in ds.train(batch_size=None, shuffle=False)
        }
        for name, data in originals.items():
            # Raw or PNG, what comes out is what decoding the PNG gives.
            want = tf.io.decode_png(data, channels=channels).numpy().astype(np.float32)
            np.testing.assert_array_equal(got[name], want, err_msg=f"{name} as {color_mode}")


def _save_png(path, pixels):
    Image.fromarray(pixels).save(path)
    return str(path)


def test_decode_takes_raw_pixels_when_they_are_exact_and_the_png_otherwise():
    import dataclasses

    from keras_datum import config
    from keras_datum import images

    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    png = tf.io.encode_png(pixels).numpy()
    parsed = {
        "image": tf.constant(b"not decodable: proves the raw pixels were used"),
        "image/format": tf.constant(b"png"),
        "image/height": tf.constant(2, tf.int64),
        "image/width": tf.constant(3, tf.int64),
        "image/pixels": tf.constant(pixels.tobytes()),
        "image/channels": tf.constant(3, tf.int64),
    }
    options = config.ReadOptions(color_mode="rgba", image_size=(2, 3))
    rgba = images.decode(parsed, options).numpy()
    np.testing.assert_array_equal(rgba[..., :3], pixels)
    assert (rgba[..., 3] == 255).all()
    # RGB to grayscale is libpng's conversion: the PNG is decoded.
    parsed["image"] = tf.constant(png)
    gray = images.decode(parsed, dataclasses.replace(options, color_mode="grayscale")).numpy()
    np.testing.assert_array_equal(gray, tf.io.decode_png(png, channels=1).numpy())


# --- PNG checks and the libspng path ----------------------------------------


def _png_bytes(image, **save_args):
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **save_args)
    return buffer.getvalue()


def _chunks(data):
    """`[(type, start, end)]` of a PNG's chunks (start of the length field,
    end after the CRC)."""
    chunks, position = [], 8
    while position < len(data):
        length = int.from_bytes(data[position : position + 4], "big")
        end = position + 12 + length
        chunks.append((data[position + 4 : position + 8], position, end))
        position = end
    return chunks


def _with_chunk(data, chunk_type, body):
    """`data` with a chunk (valid CRC) inserted before IEND."""
    iend = [start for kind, start, _ in _chunks(data) if kind == b"IEND"][0]
    crc = zlib.crc32(chunk_type + body).to_bytes(4, "big")
    chunk = len(body).to_bytes(4, "big") + chunk_type + body + crc
    return data[:iend] + chunk + data[iend:]


def _damaged(data, how):
    chunks = {kind: (start, end) for kind, start, end in _chunks(data)}
    damaged = bytearray(data)
    start, end = chunks[b"IDAT"]
    if how == "IDAT CRC":
        damaged[end - 1] ^= 0xFF
    elif how == "IHDR CRC":
        damaged[chunks[b"IHDR"][1] - 1] ^= 0xFF
    elif how == "Adler-32 only":  # The zlib checksum, with a correct chunk CRC.
        damaged[end - 5] ^= 0x01
        damaged[end - 4 : end] = zlib.crc32(bytes(damaged[start + 4 : end - 4])).to_bytes(4, "big")
    elif how == "truncated in IDAT":
        del damaged[end - 6 :]
    elif how == "no IEND":
        del damaged[chunks[b"IEND"][0] :]
    return bytes(damaged)


def _small_png_zoo():
    """Small PNGs of every kind: the plain 8-bit gray and RGB ones take the
    libspng path, the others (and those with chunks that change pixels)
    Pillow's."""
    rgb = Image.fromarray(_gradient((12, 20)))
    gamma = _png_bytes(rgb)
    gamma = _with_chunk(gamma, b"gAMA", (45455).to_bytes(4, "big"))
    return {
        "rgb": (_png_bytes(rgb), True),
        "gray": (_png_bytes(rgb.convert("L")), True),
        "rgb with gAMA and text": (_png_bytes(Image.open(io.BytesIO(gamma)), pnginfo=_text_info()), True),
        "single pixel": (_png_bytes(Image.new("RGB", (1, 1), (9, 8, 7))), True),
        "64 x 64": (_png_bytes(Image.fromarray(_gradient((64, 64)))), True),
        "65 x 64 (too many pixels for raw)": (_png_bytes(Image.fromarray(_gradient((65, 64)))), False),
        "palette": (_png_bytes(rgb.convert("P")), False),
        "rgba": (_png_bytes(rgb.convert("RGBA")), False),
        "gray alpha": (_png_bytes(rgb.convert("LA")), False),
        "16-bit": (_png_bytes(Image.fromarray(np.arange(48, dtype=np.uint16).reshape(6, 8) * 999)), False),
        "tRNS": (_png_bytes(rgb, transparency=(0, 0, 0)), False),
        "interlaced": (_interlaced(rgb), False),
        "eXIf": (_png_bytes(rgb, exif=_rotation_exif()), False),
    }


def _text_info():
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "drawn by the tests")
    return info


def _rotation_exif():
    exif = Image.Exif()
    exif[0x0112] = 6
    return exif.tobytes()


def _interlaced(image):
    # Pillow writes no interlaced PNGs; TensorFlow's encoder neither. Build
    # one: Adam7 passes of a 1 x 1 image are the one pixel, so the bytes
    # equal a plain image's except for the IHDR interlace flag and its CRC.
    data = bytearray(_png_bytes(image.resize((1, 1))))
    ihdr = [(start, end) for kind, start, end in _chunks(bytes(data)) if kind == b"IHDR"][0]
    data[ihdr[0] + 8 + 12] = 1
    data[ihdr[1] - 4 : ihdr[1]] = zlib.crc32(bytes(data[ihdr[0] + 4 : ihdr[1] - 4])).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("name", list(_small_png_zoo()))
def test_small_pngs_give_pillows_result_whichever_decoder_reads_them(tmp_path, monkeypatch, name):
    from keras_datum import encode

    if encode.pyspng is None:
        pytest.skip("pyspng has no wheel for this platform: Pillow reads every PNG")
    data, by_libspng = _small_png_zoo()[name]
    path = tmp_path / "x.png"
    path.write_bytes(data)
    calls = []
    load = encode.pyspng.load
    monkeypatch.setattr(encode.pyspng, "load", lambda b: calls.append(1) or load(b))
    fast = encode_image(str(path))
    assert bool(calls) == by_libspng
    monkeypatch.setattr(encode, "pyspng", None)
    assert fast == encode_image(str(path))
    # And the stored bytes are what TensorFlow decodes to the same pixels.
    if fast.channels:
        pixels = np.frombuffer(fast.pixels, np.uint8).reshape(fast.height, fast.width, -1)
        np.testing.assert_array_equal(_decode(fast, channels=fast.channels), pixels)


def test_a_small_png_over_the_size_cap_is_shrunk_by_pillow(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(_png_bytes(Image.fromarray(_gradient((40, 60)))))
    encoded = encode_image(str(path), max_side=20)
    assert (encoded.height, encoded.width) == (13, 20) and encoded.data != path.read_bytes()


@pytest.mark.parametrize("libspng", [True, False])
@pytest.mark.parametrize("size", [(12, 20), (80, 90)])  # Raw pixels or not.
@pytest.mark.parametrize(
    "how", ["IDAT CRC", "IHDR CRC", "Adler-32 only", "truncated in IDAT", "no IEND"]
)
def test_pngs_that_tensorflow_cannot_decode_are_invalid(tmp_path, monkeypatch, how, size, libspng):
    from keras_datum import encode

    if not libspng:
        monkeypatch.setattr(encode, "pyspng", None)
    good = _png_bytes(Image.fromarray(_gradient(size)))
    tf.io.decode_png(good)
    bad = _damaged(good, how)
    # The real decoder refuses the file: it would fail in some epoch.
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_png(bad)
    path = tmp_path / "bad.png"
    path.write_bytes(bad)
    with pytest.raises(InvalidImageError, match="PNG|not a decodable image|decoder refuses"):
        _validated(str(path))


def test_a_png_with_a_damaged_text_chunk_stays_valid_as_in_tensorflow(tmp_path):
    # libpng drops an ancillary chunk whose CRC is wrong and decodes the image.
    good = _png_bytes(Image.fromarray(_gradient()), pnginfo=_text_info())
    text = [(start, end) for kind, start, end in _chunks(good) if kind == b"tEXt"][0]
    bad = bytearray(good)
    bad[text[1] - 1] ^= 0xFF
    bad = bytes(bad)
    pixels = tf.io.decode_png(bad).numpy()
    path = tmp_path / "x.png"
    path.write_bytes(bad)
    encoded = encode_image(str(path))
    assert encoded.data == bad
    np.testing.assert_array_equal(np.frombuffer(encoded.pixels, np.uint8).reshape(pixels.shape), pixels)


@pytest.mark.parametrize(
    "dtype, value, stored",
    [(np.int32, 25700, 100), (np.float32, 0.5, 128)],  # 16-bit range; [0, 1] floats.
)
def test_32_bit_images_share_one_scale(tmp_path, dtype, value, stored):
    # The same source value is stored the same in every image, whatever
    # each image's own maximum (a TIFF with one bright pixel, one without).
    seen = []
    for peak in (value, value * 2):
        array = np.full((6, 8), value, dtype)
        array[0, 0] = peak
        path = tmp_path / f"{peak}.tif"
        Image.fromarray(array).save(path)
        assert Image.open(path).mode == ("F" if dtype == np.float32 else "I")
        seen.append(int(_decode(encode_image(str(path)), channels=1)[3, 3, 0]))
    assert seen == [stored, stored]


@pytest.mark.parametrize("mode, size", [("RGB", (300, 410)), ("RGB", (1200, 1600)), ("L", (640, 480))])
def test_a_jpeg_over_the_cap_has_the_pixels_pillows_draft_decode_gave(tmp_path, mode, size):
    # simplejpeg's strict decode replaced Pillow's draft decode: the same
    # libjpeg-turbo at the same DCT scale gives the same stored bytes.
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    path = tmp_path / "x.jpg"
    image.save(path, quality=90)
    max_side = 96
    encoded = encode_image(str(path), max_side=max_side)

    expected = Image.open(path)
    width, height = expected.size
    scale = max(max_side / max(width, height), (max_side // 2) / min(width, height))
    expected.draft(expected.mode, (int(width * scale) + 1, int(height * scale) + 1))
    expected.load()
    target = (max(1, round(width * scale)), max(1, round(height * scale)))
    expected = expected.resize(target, Image.Resampling.BICUBIC, reducing_gap=2.0)
    buffer = io.BytesIO()
    expected.save(buffer, format="JPEG", quality=95)
    assert (encoded.width, encoded.height) == target
    assert encoded.data == buffer.getvalue()
