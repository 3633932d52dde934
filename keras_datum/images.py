"""Image features shared by the image problems: how they are stored and decoded.

The PIL side (validating and converting a source file) is `encode`; this is
the TensorFlow side: the stored feature spec and the graph code that decodes
and resizes. The problem modules call these; the pipeline does not.
"""

import dataclasses

import tensorflow as tf

from keras_datum import crop
from keras_datum import encode

CHANNELS = {"grayscale": 1, "rgb": 3, "rgba": 4}
# A stored JPEG at least this many times the target on both sides is decoded
# at half size (`decode_jpeg(ratio=2)`). Up to 2x, half-scale decoding then
# resizing strays further from an antialiased resize of the full image than
# Keras's full decode with a bilinear resize does; from 2.25x up it is
# closer (`benchmarks/run.py` prints the measurement). 2.5x keeps a margin.
HALF_SCALE_MIN = 2.5
IMAGE_FEATURES = {
    "image": {"dtype": "string", "shape": []},
    "image/format": {"dtype": "string", "shape": []},
    "image/height": {"dtype": "int64", "shape": []},
    "image/width": {"dtype": "int64", "shape": []},
    # Small lossless images: their raw pixels too (empty otherwise); see
    # `encode.RAW_MAX_PIXELS`.
    "image/pixels": {"dtype": "string", "shape": []},
    "image/channels": {"dtype": "int64", "shape": []},
}


def encode_features(path, max_side=None):
    """Validates one image file; returns (its stored features, its stats).

    Returns:
        `(features, stats, source_size)`: the features to store, the stats
        (stored `height` and `width`), and the upright source image's
        `(height, width)`, which differs from the stored one when the image
        was shrunk to `max_side`.

    Raises:
        errors.InvalidImageError: the file is not a usable image.
    """
    image = encode.encode_image(path, max_side)
    features = {
        "image": image.data,
        "image/format": image.format.encode(),
        "image/height": [image.height],
        "image/width": [image.width],
        "image/pixels": image.pixels,
        "image/channels": [image.channels],
    }
    stats = {
        "height": image.height,
        "width": image.width,
        # Counted per split: when every image has raw pixels of one size, the
        # reader decodes whole batches at once (`blocks.batch_decoder`).
        "raw_images": int(image.channels > 0),
        "raw_channels": {image.channels} if image.channels else set(),
        # Taken out by the shard writer: TensorFlow's decoders judge it.
        "unsettled": not image.settled,
    }
    return features, stats, image.source_size


def decode(parsed, options):
    """The stored image as uint8 `(height, width, channels)`.

    Small lossless images come from their stored raw pixels whenever those
    give exactly what decoding the PNG would (gray to any mode, RGB to RGB or
    RGBA). A JPEG at least `HALF_SCALE_MIN` times the target size on both
    sides is decoded at half size by libjpeg's DCT scaling (`ratio=2`),
    which skips three quarters of the inverse transforms; it is resized to
    the target afterwards anyway.
    """
    channels = CHANNELS[options.color_mode]
    split = options.stored_images  # `stored_images` of the split, if known.
    if "image/pixels" not in parsed or (split and split["raw"] == "none"):
        # No raw pixels (or caches from before them).
        image = _decode_encoded(parsed, options, channels)
    elif split and split["raw"] == "all" and all(
        c == 1 or (c == 3 and channels >= 3) for c in split["raw_channels"]
    ):
        image = _from_pixels(parsed, parsed["image/channels"], channels)
    else:
        stored = parsed["image/channels"]
        usable = (stored == 1) | ((stored == 3) & (channels >= 3))
        image = tf.cond(
            usable,
            lambda: _from_pixels(parsed, stored, channels),
            lambda: _decode_encoded(parsed, options, channels),
        )
    # Known for every mode: the RGBA of a JPEG is built by a `tf.cond` that
    # leaves it unknown, and the model needs it.
    image.set_shape([None, None, channels])
    return image


def stored_images(info):
    """What a split's export stats say about its stored images, or `None`.

    `decode` uses it to choose its path once, when the split is built,
    instead of per image: a `tf.cond` costs a little per image, and its
    branches are instantiated again in every epoch, which a short epoch
    feels. `blocks.raw_layout` uses it to decide whether whole blocks
    of a split decode at once.
    """
    sizes = info.get("image_sizes") or {}
    if "raw_images" not in info or "height" not in sizes or "width" not in sizes:
        return None  # An export without these stats.
    raw = info["raw_images"]
    return {
        "raw": "none" if raw == 0 else "all" if raw == info["num_examples"] else "some",
        "raw_channels": list(info.get("raw_channels") or []),
        "min_height": sizes["height"]["min"],
        "max_height": sizes["height"]["max"],
        "min_width": sizes["width"]["min"],
        "max_width": sizes["width"]["max"],
    }


def _from_pixels(parsed, stored, channels):
    shape = tf.stack([parsed["image/height"], parsed["image/width"], stored])
    image = tf.reshape(tf.io.decode_raw(parsed["image/pixels"], tf.uint8), shape)
    return expand_channels(image, channels)


def expand_channels(image, channels):
    """Gray or RGB uint8 pixels (`(..., 1 or 3)`, one image or a batch) in
    `channels`, as `decode_png` converts them: gray is repeated into RGB, and
    RGBA gets an opaque alpha. Only conversions that are exact: RGB to
    grayscale is not one of them (libpng weighs the channels its own way)."""
    if channels == 1:
        return image
    rank = image.shape.rank
    rgb = tf.cond(
        tf.equal(tf.shape(image)[-1], 1),
        lambda: tf.tile(image, [1] * (rank - 1) + [3]),
        lambda: image,
    )
    if channels == 3:
        return rgb
    alpha = tf.fill(tf.concat([tf.shape(rgb)[:-1], [1]], 0), tf.constant(255, tf.uint8))
    return tf.concat([rgb, alpha], axis=-1)


def _decode_encoded(parsed, options, channels):
    def full():
        return tf.io.decode_image(
            parsed["image"], channels=channels, expand_animations=False
        )

    is_jpeg = tf.equal(parsed["image/format"], "jpeg")
    if channels == 4:  # libjpeg gives no alpha channel: JPEGs get an opaque one.

        def opaque_jpeg():
            return expand_channels(tf.io.decode_jpeg(parsed["image"], channels=3), 4)

        return tf.cond(is_jpeg, opaque_jpeg, full)
    target_height, target_width = options.image_size
    split = options.stored_images
    if split and (
        split["max_height"] < HALF_SCALE_MIN * target_height
        or split["max_width"] < HALF_SCALE_MIN * target_width
    ):
        return full()  # No image of the split is big enough to halve.
    halve = (
        is_jpeg
        & (tf.cast(parsed["image/height"], tf.float32) >= HALF_SCALE_MIN * target_height)
        & (tf.cast(parsed["image/width"], tf.float32) >= HALF_SCALE_MIN * target_width)
    )
    return tf.cond(
        halve,
        lambda: tf.io.decode_jpeg(parsed["image"], channels=channels, ratio=2),
        full,
    )


def _crop_to_aspect_ratio(image, image_size):
    """The centre crop with the target's aspect ratio, as Keras's `smart_resize`."""
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    target_height, target_width = image_size
    crop_height = tf.minimum(height, (width * target_height) // target_width)
    crop_width = tf.minimum(width, (height * target_width) // target_height)
    top = (height - crop_height) // 2
    left = (width - crop_width) // 2
    return image[top : top + crop_height, left : left + crop_width]


def pad_geometry(height, width, image_size):
    """Where `tf.image.resize_with_pad` puts the image: (scaled h, w, top, left).

    The same arithmetic as TensorFlow's, so that boxes can follow the pixels.
    """
    height = tf.cast(height, tf.float32)
    width = tf.cast(width, tf.float32)
    target_height, target_width = image_size
    ratio = tf.maximum(width / target_width, height / target_height)
    scaled_height = tf.floor(height / ratio)
    scaled_width = tf.floor(width / ratio)
    # The padding follows the unrounded scaled size, as TensorFlow's does:
    # from the rounded one, a 333x500 image padded to 640x640 would sit a
    # pixel below where its pixels are.
    top = tf.floor(tf.maximum(0.0, (target_height - height / ratio) / 2))
    left = tf.floor(tf.maximum(0.0, (target_width - width / ratio) / 2))
    return scaled_height, scaled_width, top, left


def resize(image, options, method=None):
    """Resizes a decoded image to `image_size`, as float32 in [0, 255].

    `method` overrides `options.interpolation` (masks use "nearest").
    """
    image_size = options.image_size
    method = method or options.interpolation
    channels = image.shape[-1]
    if options.pad_to_aspect_ratio:
        image = tf.image.resize_with_pad(
            image, image_size[0], image_size[1], method=method
        )
    else:
        if options.crop_to_aspect_ratio:
            image = _crop_to_aspect_ratio(image, image_size)
        image = tf.image.resize(image, image_size, method=method)
    image = tf.cast(image, tf.float32)
    image.set_shape((image_size[0], image_size[1], channels))
    return image


def decode_and_resize(parsed, options, seed=None):
    """The image at `image_size`: its random-resized-crop window, with
    `options.random_resized_crop` and the example's `seed` (see
    `decode_window`), else the whole image."""
    if options.random_resized_crop is None or seed is None:
        return resize(decode(parsed, options), options)
    return resize(decode_window(parsed, options, seed)[0], window_options(options))


def decode_window(parsed, options, seed):
    """`(pixels, window)`: the stored image's random-resized-crop window
    (`crop.window`, drawn from `seed` on the stored size), uint8. A JPEG
    is decoded within the window alone (at half scale when the window is
    large enough: see `crop.decode_jpeg_window`); other images (and RGBA,
    which libjpeg cannot give) are decoded whole, then cropped."""
    window = crop.window(
        parsed["image/height"], parsed["image/width"], options.random_resized_crop, seed
    )
    channels = CHANNELS[options.color_mode]

    def whole():
        # `decode` halves big JPEGs only: a JPEG does not come here.
        return crop.cropped(decode(parsed, options), window)

    if channels == 4 or "image" not in parsed:
        return whole(), window
    pixels = tf.cond(
        tf.equal(parsed["image/format"], "jpeg"),
        lambda: crop.decode_jpeg_window(
            parsed["image"], window, options.image_size, channels, HALF_SCALE_MIN
        ),
        whole,
    )
    pixels.set_shape([None, None, channels])
    return pixels, window


def window_options(options):
    """The read options a crop window is resized with: straight to
    `image_size`, as torchvision's `RandomResizedCrop` (the window already
    has a ratio near the target's)."""
    return dataclasses.replace(options, crop_to_aspect_ratio=False, pad_to_aspect_ratio=False)
