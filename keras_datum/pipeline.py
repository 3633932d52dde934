"""The tf.data read path: shards -> examples -> decoded inputs -> batches.

Everything here is graph code: no Python runs per example.
"""

import dataclasses
import functools

import tensorflow as tf

from keras_datum import blocks
from keras_datum import decoding
from keras_datum import images
from keras_datum import memory
from keras_datum import problems
from keras_datum import read_guard
from keras_datum import shard_reader

AUTOTUNE = tf.data.AUTOTUNE
# Encoded examples held for shuffling. With the write-time shuffle and the
# interleave of several shards, a few thousand already mixes the classes well.
DEFAULT_SHUFFLE_BUFFER = 2048

# Moved to `decoding` and `shard_reader`; their callers know them here.
parse_spec = decoding.parse_spec
decode_example = decoding.decode_example
file_names = shard_reader.file_names
shard_paths = shard_reader.shard_paths

def decoded_bytes(meta, split, options):
    """Memory the decoded split takes at the target size, as uint8."""
    info = meta.splits[split].stats
    if "image" not in meta.features:  # Text.
        return info.get("characters", 0) + 64 * info["num_examples"]
    height, width = options.image_size
    channels = images.CHANNELS[options.color_mode] + ("mask" in meta.features)
    # One-hot and multi-hot labels are float32 vectors, one per example:
    # with many classes they outweigh small images.
    spec = meta.label_spec or {}
    hot = spec.get("type") == "multi_label" or (
        spec.get("type") == "class" and options.label_mode == "categorical"
    )
    labels = 4 * spec["num_classes"] if hot else 0
    return info["num_examples"] * (height * width * channels + labels + 64)


def decoded_cache(runtime, meta, split, options):
    """`(cache, budget)`: whether `split` gets the decoded cache with the
    `config.RuntimeOptions` `runtime`, and the budget its decoded size was
    judged against (`None` unless `cache="auto"`)."""
    if runtime.cache != "auto":
        return runtime.cache, None
    budget = runtime.cache_budget or memory.default_cache_budget()
    return decoded_bytes(meta, split, options) <= budget, budget


def _examples(
    paths, counts, meta, options, *, batch_decoder, cache, shuffle, repeat, seed,
    deterministic, buffer, shuffle_files, whole, shard_by_example, block, guard,
    on_invalid="raise", split="train", service=False,
):
    """The split's decoded examples, one at a time: shuffled, repeated and
    cached as asked (see `build`). `shard_by_example` is `(index, count)`
    when this worker takes every `count`-th example, else `None`."""
    num_examples = sum(counts)
    # Whole-batch decoding takes the reader's blocks as they come, unless
    # serialized records are shuffled before decoding (no cache). Sharing
    # by example needs the same record order on every worker.
    from_blocks = batch_decoder is not None and (cache or not shuffle) and shard_by_example is None
    if from_blocks:
        dataset = shard_reader.serialized_blocks(paths, counts, False, seed, deterministic, block, guard)
    else:
        dataset = shard_reader.serialized(
            paths, counts, num_examples, shuffle_files, seed,
            deterministic or shard_by_example is not None, whole, block, guard,
            # Naming a failing example (on_invalid="raise") needs its place.
            places=batch_decoder is None and on_invalid == "raise",
        )
    if shard_by_example is not None:
        dataset = dataset.shard(shard_by_example[1], shard_by_example[0])

    def decoded(dataset, then=decoding.unchanged, finite=True):
        """Serialized examples -> decoded dicts, with `then` applied (fused).

        Whole-batch decoding unbatches, which forgets the count: it is
        asserted again when this reader sees the whole split, once."""
        if batch_decoder is not None:
            dataset = batch_decoder(
                dataset if from_blocks else dataset.batch(blocks.DECODE_BATCH), deterministic, then
            ).unbatch()
            if whole and shard_by_example is None and finite:
                dataset = shard_reader.with_count(dataset, num_examples)
            return dataset
        decode = lambda s: then(decoding.decode_example(s, meta, options))
        if meta.in_place:
            dataset = read_guard.labels_checked(dataset, meta.json)
        if on_invalid == "raise":
            def guard(examples, number, quiet=False):
                return read_guard.naming_decode(examples, decode, paths, split)
        else:
            def guard(examples, number, quiet=False):
                return read_guard.skipping_decode(examples, decode, split, service, quiet, number)

        def guarded(quiet=False):
            return read_guard.in_blocks(dataset, functools.partial(guard, quiet=quiet))
        # The guard drops failing examples, so tf.data no longer knows the
        # count: it is asserted again, as the stream before the guard had it.
        count = tf.get_static_value(dataset.cardinality())
        if count is None or count == tf.data.UNKNOWN_CARDINALITY:
            return guarded()
        if count == tf.data.INFINITE_CARDINALITY or on_invalid == "raise":
            return shard_reader.with_count(guarded(), count)
        # The epoch keeps its length (Keras's steps, `len()`): the places of
        # skipped examples go to the first examples of a second, quiet pass,
        # which is only read when an example was skipped.
        passes = tf.data.Dataset.range(2).flat_map(lambda second: guarded(quiet=second > 0))
        return shard_reader.with_count(passes.take(count), count)

    if cache:
        # Decode once, keep uint8 pixels at the target size in memory, and
        # shuffle the decoded elements: later epochs decode nothing. The
        # cast back to float32 waits for the batch when nothing per example
        # needs floats, so a cached epoch costs a few operations per batch.
        dataset = decoded(dataset, then=decoding.pixels_as(tf.uint8, options.interpolation)).cache()
    if shuffle:
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if not cache:
        dataset = decoded(dataset, finite=not repeat)
    return dataset


# Float pixels of a window (the shuffle buffer) at most this big get the
# pipeline's last step before the cut into batches (see `build`).
EARLY_FINISH_BYTES = 64 * 1024 * 1024


def _float_bytes(dataset, count):
    """Bytes of `count` examples of `dataset`'s (batched) pixels as float32."""
    spec = dataset.element_spec.get("images")
    if spec is None or not spec.shape[1:].is_fully_defined():
        return float("inf")
    return 4 * count * spec.shape[1:].num_elements()


def _int_labels(labels_spec):
    """Whether the labels read are integers (class indices)."""
    return labels_spec is not None and labels_spec.dtype.is_integer


def _finisher(image_dtype, problem, labels_spec, resized_by=None):
    """The pipeline's last step, on examples or batches of them: images in
    `image_dtype` (cached ones are uint8), labels back in `labels_spec`'s
    dtype, as read (augmentation takes them as float32), then the problem's
    `(x, y)`. Images leaving as uint8 are rounded, and clipped unless
    `resized_by` (the interpolation, when nothing ran after the resize)
    cannot have left [0, 255]; uint8 images pass untouched."""
    int_labels = _int_labels(labels_spec)
    to_float = decoding.pixels_as(tf.float32)
    image_dtype = tf.as_dtype(image_dtype)

    def finish(inputs):
        inputs = dict(inputs)
        images = inputs.pop("images", None)
        inputs = to_float(inputs)
        if images is not None:
            if image_dtype != tf.uint8:
                images = tf.cast(images, image_dtype)
            elif images.dtype != tf.uint8:
                images = decoding.rounded_uint8(images, resized_by)
            inputs["images"] = images
        if int_labels:
            inputs["labels"] = tf.cast(inputs["labels"], labels_spec.dtype)
        return problem.to_keras(inputs)

    return finish


def build(
    meta,
    cache_dir,
    split,
    options,
    *,
    batch_size,
    shuffle,
    repeat,
    seed,
    shuffle_buffer_size,
    augment=None,
    batch_augment=None,
    image_dtype="float32",
    shard_policy=None,
    cache=False,
    data_service=None,
    shard_subset=None,
    guard=None,
    on_invalid="raise",
):
    """The `tf.data.Dataset` of `(x, y)` batches for one split.

    `augment` runs on each decoded example, `batch_augment` on each batch,
    both on the KerasCV dict. With a `seed` they run in order on one thread
    (after restarting their random generators), so the augmented stream
    repeats exactly; without one they run in parallel. With `cache`, the
    decoded, resized pixels are kept in memory as uint8 after the first
    epoch (see `decoded_bytes`). With `data_service` (a dispatcher address),
    everything up to the batches runs on tf.data service workers. With
    `shard_subset=(index, count)` this pipeline reads only every `count`-th
    shard file from the `index`-th: one worker's share of the split (every
    `count`-th example when there are fewer files than workers). With
    `guard` (see `_guarded`), a cache exported over since is refused.
    An example that fails to decode raises naming it, or with
    `on_invalid="skip"` is skipped and reported (see `read_guard`).
    """
    if data_service:
        # Each worker gets other shards in every epoch: a worker-side cache
        # would hold the wrong examples.
        cache = False
    paths, counts = shard_reader.shards(meta, cache_dir, split)
    # The split's export stats let the image decoder choose its path once.
    options = dataclasses.replace(
        options, stored_images=images.stored_images(meta.splits[split].stats)
    )
    # Each input pipeline (worker) reads its own files; a split with fewer
    # files than workers (fewer examples than workers) is shared by example.
    by_example = shard_subset is not None and len(paths) < shard_subset[1]
    if shard_subset is not None and not by_example:
        index, count = shard_subset
        paths, counts = paths[index::count], counts[index::count]
    deterministic = not shuffle or seed is not None
    num_examples = sum(counts)
    buffer = shuffle_buffer_size or min(DEFAULT_SHUFFLE_BUFFER, max(1, num_examples))
    whole = not data_service and not by_example
    shuffle_files = shuffle and not cache and not by_example
    layout = blocks.raw_layout(meta, split, options)
    batch_decoder = None if layout is None else blocks.batch_decoder(meta, options, layout)
    problem = problems.get(meta.problem)
    block = shard_reader.block_records(paths, counts)
    if (
        batch_decoder is not None
        and augment is None
        and batch_size is not None
        and not by_example
        and not problem.batches_itself
    ):
        # Nothing happens per example: blocks of records are decoded,
        # cached, shuffled and cut into batches as blocks.
        decoded = shard_reader.serialized_blocks(
            paths, counts, shuffle_files, seed, deterministic, block, guard
        )
        to_uint8 = (
            decoding.pixels_as(tf.uint8, options.interpolation) if cache else decoding.unchanged
        )
        decoded = batch_decoder(decoded, deterministic, to_uint8)
        if cache:
            decoded = decoded.cache()
        # The last step runs on whole windows when nothing works on batches
        # and a window's float pixels stay small: one step per batch fewer.
        # Windows that small are also made one ahead.
        small_windows = _float_bytes(decoded, buffer) <= EARLY_FINISH_BYTES
        early = batch_augment is None and small_windows
        labels_spec = decoded.element_spec.get("labels")
        dataset = blocks.block_batches(
            decoded, batch_size, shuffle, repeat, seed, deterministic, buffer, block,
            # Cached blocks are references: many can take part in the
            # shuffle (decoded blocks read anew are bounded by `buffer`).
            max_blocks=len(paths) + min(num_examples, blocks.MAX_SHUFFLED_EXAMPLES) // block
            if cache
            else None,
            num_examples=num_examples if whole else None,
            then=_finisher(image_dtype, problem, labels_spec, options.interpolation)
            if early
            else None,
            ahead=small_windows,
        )
        batched = True
    else:
        dataset = _examples(
            paths, counts, meta, options, batch_decoder=batch_decoder, cache=cache,
            shuffle=shuffle, repeat=repeat, seed=seed, deterministic=deterministic,
            buffer=buffer, shuffle_files=shuffle_files, whole=whole,
            shard_by_example=shard_subset if by_example else None, block=block, guard=guard,
            on_invalid=on_invalid, split=split, service=bool(data_service),
        )
        batched = early = False
        labels_spec = dataset.element_spec.get("labels")
    for augmentation in (augment, batch_augment):
        if augmentation is not None and seed is not None:
            augmentation.reseed(seed)
    int_labels = _int_labels(labels_spec)
    to_float = decoding.pixels_as(tf.float32)

    def augmented(augmentation, then=None):
        """`augmentation` on what the layers take: float32 pixels (cached ones
        are uint8) and float32 labels. KerasCV layers mix float and integer
        labels across their branches (RandAugment fails on int32); class
        indices survive the round trip exactly. `then(outputs, options)`
        puts the result back in the problem's form (boxes to `max_boxes`)."""
        read_options = options

        def apply(inputs):
            inputs = to_float(inputs)
            if int_labels:
                inputs["labels"] = tf.cast(inputs["labels"], tf.float32)
            outputs = augmentation(inputs)
            return outputs if then is None else then(outputs, read_options)

        return apply

    augment_calls = AUTOTUNE if seed is None else None
    if augment is not None:
        dataset = dataset.map(augmented(augment), num_parallel_calls=augment_calls)
    if problem.batches_itself:
        dataset = problem.batch(dataset, batch_size, options)
        count = (
            problem.batch_count(paths, batch_size, options)
            # An augment step may change what the batches are made by.
            if whole and not repeat and augment is None
            else None
        )
        if count is not None:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    elif batch_size is not None and not batched:
        dataset = dataset.batch(
            batch_size, num_parallel_calls=AUTOTUNE, deterministic=deterministic
        )
    if batch_augment is not None:
        dataset = dataset.map(
            augmented(batch_augment, then=problem.after_batch_augment),
            num_parallel_calls=augment_calls,
        )
    if not early:
        finish = _finisher(
            image_dtype, problem, labels_spec,
            # Augmentation can move pixels out of [0, 255].
            options.interpolation if augment is None and batch_augment is None else None,
        )
        # Batches of small raw-pixel images cast in a moment: one at a time,
        # ahead of the consumer (the prefetch below), holds fewer in memory.
        dataset = dataset.map(finish, num_parallel_calls=None if batched else AUTOTUNE)
    if data_service:
        # DYNAMIC sharding hands each shard file to one worker per epoch, so
        # every example is produced exactly once per epoch (at most once if a
        # worker dies mid-epoch).
        dataset = dataset.apply(
            tf.data.experimental.service.distribute(
                processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
                service=data_service,
            )
        )
    options = tf.data.Options()
    # tf.data's default graph rewrites run at every iterator creation, that
    # is every epoch, and cost more than they save here: the parallelism and
    # the prefetching above are placed by hand (measured with
    # benchmarks/run.py: about 20 ms less per epoch, up to 12% on a small
    # split's first epoch).
    options.experimental_optimization.apply_default_optimizations = False
    if shard_policy is not None:
        options.experimental_distribute.auto_shard_policy = shard_policy
    return dataset.with_options(options).prefetch(AUTOTUNE)
