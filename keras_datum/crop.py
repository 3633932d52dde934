"""The fused random-resized-crop: draw the crop window first, then decode
only that window (graph code).

ImageNet-style training keeps a random window of each image (torchvision's
`RandomResizedCrop`), and decoding the whole image to throw most of it away
is what bounds such epochs. As FFCV's `RandomResizedCropRGBImageDecoder`
and DALI's `image_random_crop` do, a stored JPEG is decoded here within the
window alone (`tf.io.decode_and_crop_jpeg`), at half scale by libjpeg's DCT
scaling when the window is at least `images.HALF_SCALE_MIN` times the target
on both sides; other images are decoded whole, then cropped. Masks follow
the image's window; boxes are moved and clipped to it.

The window follows torchvision's distribution: an area fraction uniform in
`scale`, an aspect ratio log-uniform in `ratio`, 10 attempts, then the
centre crop of the whole image clamped to `ratio`. Its randomness is drawn
from `(seed, epoch, record)` alone, so a resumed stream repeats it.
"""

import dataclasses
import math

import tensorflow as tf

_ATTEMPTS = 10
# The second word of a window's seed, besides the epoch.
_SALT = 719201934


@dataclasses.dataclass(frozen=True)
class RandomResizedCrop:
    """The fused crop's options (see `DatumDataset.train`).

    Attributes:
        scale: the bounds of the window's area, as fractions of the image's.
        ratio: the bounds of its aspect ratio, width over height.
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    @classmethod
    def from_argument(cls, value):
        """`train(random_resized_crop=...)`: None, True (torchvision's
        defaults) or `(scale, ratio)`, each a `(low, high)` pair.

        Raises:
            ValueError: naming the argument, for anything else.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        try:
            scale, ratio = value
            scale, ratio = tuple(float(s) for s in scale), tuple(float(r) for r in ratio)
        except (TypeError, ValueError):
            scale = ratio = None
        if (
            scale is None or len(scale) != 2 or len(ratio) != 2
            or not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1]
        ):
            raise ValueError(
                "`random_resized_crop` must be True or `(scale, ratio)`, two `(low, high)` "
                "pairs with 0 < scale low <= high <= 1 and 0 < ratio low <= high, "
                f"as torchvision's `RandomResizedCrop`; received: {value!r}."
            )
        return cls(scale, ratio)


def seed_of(seed, epoch, record):
    """The stateless seed of one example's window: `(seed, epoch, record)`."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.constant(_SALT, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_fold_in(key, tf.cast(record, tf.int64))


def window(height, width, crop, seed):
    """torchvision's `RandomResizedCrop.get_params` in the graph: the window
    `(top, left, crop height, crop width)`, int32, of an image of `height`
    by `width`, drawn from `seed`."""
    height = tf.cast(height, tf.int32)
    width = tf.cast(width, tf.int32)
    draws = tf.random.stateless_uniform([_ATTEMPTS, 4], seed, dtype=tf.float32)
    area = tf.cast(height * width, tf.float32)
    low, high = math.log(crop.ratio[0]), math.log(crop.ratio[1])
    target = area * (crop.scale[0] + draws[:, 0] * (crop.scale[1] - crop.scale[0]))
    aspect = tf.exp(low + draws[:, 1] * (high - low))
    # Python's (and torchvision's) `round`: half to even, as `tf.round`.
    crop_width = tf.cast(tf.round(tf.sqrt(target * aspect)), tf.int32)
    crop_height = tf.cast(tf.round(tf.sqrt(target / aspect)), tf.int32)
    fits = (crop_width > 0) & (crop_width <= width) & (crop_height > 0) & (crop_height <= height)
    # torchvision's `randint(0, n + 1)` of each attempt: a uniform draw.
    tops = tf.cast(draws[:, 2] * tf.cast(height - crop_height + 1, tf.float32), tf.int32)
    lefts = tf.cast(draws[:, 3] * tf.cast(width - crop_width + 1, tf.float32), tf.int32)
    first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
    drawn = tf.stack([tops[first], lefts[first], crop_height[first], crop_width[first]])
    return tf.where(tf.reduce_any(fits), drawn, _centre(height, width, crop))


def _centre(height, width, crop):
    """torchvision's fallback: the whole image, clamped to `crop.ratio`,
    centred."""
    in_ratio = tf.cast(width, tf.float32) / tf.cast(height, tf.float32)
    low, high = crop.ratio
    crop_width = tf.where(
        in_ratio > high, tf.cast(tf.round(tf.cast(height, tf.float32) * high), tf.int32), width
    )
    crop_height = tf.where(
        in_ratio < low, tf.cast(tf.round(tf.cast(width, tf.float32) / low), tf.int32), height
    )
    return tf.stack([(height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width])


def decode_jpeg_window(contents, window_, image_size, channels, half_scale_min):
    """The pixels of `window_` of a JPEG, decoded within it alone: at half
    scale (libjpeg's DCT scaling, the window then in half-scale
    coordinates) when it is at least `half_scale_min` times `image_size`
    on both sides."""
    target_height, target_width = image_size
    halve = (
        (tf.cast(window_[2], tf.float32) >= half_scale_min * target_height)
        & (tf.cast(window_[3], tf.float32) >= half_scale_min * target_width)
    )
    return tf.cond(
        halve,
        lambda: tf.io.decode_and_crop_jpeg(
            contents, tf.maximum(window_ // 2, [0, 0, 1, 1]), channels=channels, ratio=2
        ),
        lambda: tf.io.decode_and_crop_jpeg(contents, window_, channels=channels),
    )


def cropped(image, window_):
    """`window_` of a decoded image (or mask)."""
    top, left, height, width = tf.unstack(window_)
    return image[top : top + height, left : left + width]


def moved_boxes(boxes, classes, height, width, window_):
    """Boxes in relative `xyxy` of the whole `height` by `width` image ->
    relative to the window, clipped to it; the boxes left with no area
    are dropped with their classes. Returns `(boxes, classes)`."""
    top, left, crop_height, crop_width = tf.unstack(tf.cast(window_, tf.float32))
    size = tf.stack([tf.cast(width, tf.float32), tf.cast(height, tf.float32)] * 2)
    moved = (boxes * size - tf.stack([left, top] * 2)) / tf.stack([crop_width, crop_height] * 2)
    moved = tf.clip_by_value(moved, 0.0, 1.0)
    kept = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
    return tf.boolean_mask(moved, kept), tf.boolean_mask(classes, kept)
