"""The block path: splits of same-size raw-pixel images read, decoded,
cached, shuffled and cut into batches a block of examples at a time, with
no step per example (see `pipeline.build`).
"""

import dataclasses

import tensorflow as tf

from keras_datum import decoding
from keras_datum import images
from keras_datum import problems
from keras_datum.problems import labels

AUTOTUNE = tf.data.AUTOTUNE

# Serialized examples parsed and decoded together on the batch fast path.
DECODE_BATCH = 256
# Cached examples whose blocks are shuffled at once on the batch fast path
# (all of a smaller split). More would delay the first batch of the first
# epoch, which waits for the buffer to fill.
MAX_SHUFFLED_EXAMPLES = 16384


@dataclasses.dataclass(frozen=True)
class RawLayout:
    """The raw pixels that every image of a split stores, all of one size.

    Attributes:
        height: the stored images' height.
        width: their width.
        channels: the channels stored (1 or 3).
    """

    height: int
    width: int
    channels: int


def raw_layout(meta, split, options):
    """The `RawLayout` of a split whose blocks of records decode whole, or None.

    When every image of a classification split has raw pixels (small
    lossless images, see `encode.RAW_MAX_PIXELS`) of one size and one
    channel count, each block of serialized examples is parsed with one
    `parse_example` and its pixels with one `decode_raw` (`batch_decoder`):
    the per-example parsing and decoding, most of the cost of tiny images,
    is gone. Pixels that need no resize stay uint8 until the pipeline's
    per-batch cast; what comes out of the pipeline is exactly what the
    per-example path gives.
    """
    stored = images.stored_images(meta.splits[split].stats)
    want = images.CHANNELS[options.color_mode]
    if (
        stored is None
        or meta.problem != problems.classification.NAME
        or meta.label_spec["type"] not in ("class", "regression", "none")
        # Binary labels are reshaped per example.
        or options.label_mode == "binary"
        or stored["raw"] != "all"
        or len(stored["raw_channels"]) != 1
        or (stored["raw_channels"][0] == 3 and want == 1)  # libpng's gray conversion: per image.
        or stored["min_height"] != stored["max_height"]
        or stored["min_width"] != stored["max_width"]
    ):
        return None
    height, width = stored["max_height"], stored["max_width"]
    if (height, width) != tuple(options.image_size) and (
        options.crop_to_aspect_ratio or options.pad_to_aspect_ratio
    ):
        return None
    return RawLayout(height, width, stored["raw_channels"][0])


def batch_decode(meta, options, layout):
    """`decode(serialized)`: a 1-D tensor of serialized examples of a split
    of `layout` (see `raw_layout`) -> the batch of their decoded examples."""
    height, width, raw_channels = layout.height, layout.width, layout.channels
    want = images.CHANNELS[options.color_mode]
    spec = decoding.parse_spec(meta.features)
    spec.pop("image")  # The encoded copy is not needed.
    def decode_batch(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        pixels = tf.io.decode_raw(parsed.pop("image/pixels"), tf.uint8)
        batch = images.expand_channels(tf.reshape(pixels, [-1, height, width, raw_channels]), want)
        if (height, width) != tuple(options.image_size):
            batch = tf.image.resize(batch, options.image_size, method=options.interpolation)
        # Pixels that were not resized stay uint8: the cache keeps them as
        # they are, and the cast to float32 happens once per batch.
        batch.set_shape((None, *options.image_size, want))
        # Integer, one-hot and regression labels are element-wise: the
        # problem's own labelling works on the whole batch.
        return labels.with_labels({"images": batch}, parsed, meta.json, options)

    return decode_batch


def batch_decoder(meta, options, layout):
    """The whole-batch decoder of a split of `layout` (see `raw_layout`):
    `apply(blocks, deterministic, then)` maps blocks of serialized examples
    to blocks of decoded examples."""
    decode_batch = batch_decode(meta, options, layout)

    def apply(blocks, deterministic, then=decoding.unchanged):
        """Blocks of serialized examples -> blocks of decoded examples.

        `then` (element-wise, such as the cast to uint8) runs per block too,
        so no per-example step is left."""
        return blocks.map(
            lambda s: then(decode_batch(s)),
            num_parallel_calls=AUTOTUNE,
            deterministic=deterministic,
        )

    return apply


def block_batches(
    blocks, batch_size, shuffle, repeat, seed, deterministic, window, block, max_blocks,
    num_examples, then=None, ahead=False,
):
    """Blocks of decoded examples -> batches, with no step per example.

    Shuffling is in two stages: the blocks' order (all of them when
    `max_blocks` is given, as for a cached split; else about a window's
    worth), then a random permutation of each window of `window`
    consecutive examples. A batch therefore mixes examples from several
    blocks, as a shuffle buffer of `window` examples would. `then`
    (element-wise) runs on each window, or each block when nothing is
    shuffled, before the cut into batches. With `ahead`, the next window is
    made while the current one is cut (one more window in memory).
    """
    if shuffle:
        blocks = blocks.shuffle(
            max_blocks or max(1, window // block), seed=seed, reshuffle_each_iteration=True
        )
        windows = tf.data.Dataset.zip(
            (
                blocks.rebatch(window),
                tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True),
            )
        )

        def permute(inputs, draw):
            size = tf.shape(tf.nest.flatten(inputs)[0])[0]
            order = tf.random.experimental.stateless_shuffle(
                tf.range(size), seed=tf.stack([draw, tf.constant(0, tf.int64)])
            )
            permuted = tf.nest.map_structure(lambda t: tf.gather(t, order), inputs)
            return permuted if then is None else then(permuted)

        # One window at a time: a permutation is a quick gather, and windows
        # permuted ahead in parallel would each hold a window's memory. But
        # the next window is made while this one is cut into batches (when
        # windows are small, `ahead`): made on demand, it stalls the batches
        # behind it for a whole window's work, longer than the prefetched
        # batches last (+10% on later cached tiny-image epochs, paired A/B).
        blocks = windows.map(permute)
        if ahead:
            blocks = blocks.prefetch(1)
    elif then is not None:
        blocks = blocks.map(then)
    if repeat:
        blocks = blocks.repeat()
    batches = blocks.rebatch(batch_size)
    if num_examples is not None and not repeat:
        batches = batches.apply(
            tf.data.experimental.assert_cardinality(-(-num_examples // batch_size))
        )
    return batches
