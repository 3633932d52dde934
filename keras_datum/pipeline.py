"""The tf.data read path: shards -> examples -> decoded inputs -> batches.

Everything here is graph code: no Python runs per example.
"""

import os

import tensorflow as tf

from keras_datum import datum_format
from keras_datum import export
from keras_datum import images
from keras_datum import problems

AUTOTUNE = tf.data.AUTOTUNE
# Encoded examples held for shuffling. With the write-time shuffle and the
# interleave of several shards, a few thousand already mixes the classes well.
DEFAULT_SHUFFLE_BUFFER = 2048
MAX_INTERLEAVE = 16
# Records counted at a time when checking a shard's length (see _shard_records).
COUNT_BLOCK = 256
_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}


def parse_spec(features):
    """The `tf.io.parse_single_example` spec for the metadata's feature spec.

    The source file name is stored for reports and debugging, not read back:
    parsing it for every example would be work thrown away.
    """
    spec = {}
    for name, feature in features.items():
        if name in export.SOURCE_FEATURES:
            continue
        dtype = _DTYPES[feature["dtype"]]
        if feature["shape"] is None:
            spec[name] = tf.io.VarLenFeature(dtype)
        else:
            spec[name] = tf.io.FixedLenFeature(feature["shape"], dtype)
    return spec


def decode_example(serialized, meta, options):
    """One serialized example -> the problem's KerasCV dict."""
    if datum_format.META_KEY in meta:  # A datum export, read in place.
        parsed = datum_format.parse_example(serialized, meta)
        return problems.get(meta["problem"]).decode(parsed, meta, options)
    parsed = tf.io.parse_single_example(serialized, parse_spec(meta["features"]))
    parsed = {
        k: tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v
        for k, v in parsed.items()
    }
    return problems.get(meta["problem"]).decode(parsed, meta, options)


# Serialized examples parsed and decoded together on the batch fast path.
DECODE_BATCH = 256


def _batch_decoder(meta, split, options):
    """A whole-batch decoder for splits of same-size raw-pixel images, or None.

    When every image of a classification split has raw pixels (small
    lossless images, see `encode.RAW_MAX_PIXELS`) of one size and one
    channel count, a batch of serialized examples is parsed with one
    `parse_example` and its pixels with one `decode_raw`: the per-example
    parsing and decoding, most of the cost of tiny images, is gone. The
    result is exactly what the per-example path gives.
    """
    info = meta["splits"][split]
    sizes = info.get("image_sizes") or {}
    channels = info.get("raw_channels") or []
    want = images.CHANNELS[options["color_mode"]]
    if (
        meta["problem"] != "classification"
        or meta["label_spec"]["type"] not in ("class", "regression", "none")
        # Binary labels are reshaped per example.
        or options["label_mode"] == "binary"
        or info.get("raw_images") != info["num_examples"]
        or len(channels) != 1
        or (channels[0] == 3 and want == 1)  # libpng's gray conversion: per image.
        or any(sizes.get(k, {}).get("min") != sizes.get(k, {}).get("max") for k in ("height", "width"))
    ):
        return None
    height, width = sizes["height"]["min"], sizes["width"]["min"]
    if (height, width) != tuple(options["image_size"]) and (
        options["crop_to_aspect_ratio"] or options["pad_to_aspect_ratio"]
    ):
        return None
    stored = channels[0]
    spec = parse_spec(meta["features"])
    spec.pop("image")  # The encoded copy is not needed.
    problem = problems.get(meta["problem"])

    def decode_batch(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        pixels = tf.io.decode_raw(parsed.pop("image/pixels"), tf.uint8)
        batch = images.expand_channels(tf.reshape(pixels, [-1, height, width, stored]), want)
        if (height, width) != tuple(options["image_size"]):
            batch = tf.image.resize(batch, options["image_size"], method=options["interpolation"])
        batch = tf.cast(batch, tf.float32)
        batch.set_shape((None, *options["image_size"], want))
        # Integer, one-hot and regression labels are element-wise: the
        # problem's own labelling works on the whole batch.
        return problem.with_labels({"images": batch}, parsed, meta, options)

    def apply(dataset, deterministic, then):
        """`then` (element-wise, such as the cast to uint8) runs per batch too,
        so no per-example step is left."""
        return (
            dataset.batch(DECODE_BATCH)
            .map(lambda s: then(decode_batch(s)), num_parallel_calls=AUTOTUNE,
                 deterministic=deterministic)
            .unbatch()
        )

    return apply


def _shards(meta, cache_dir, split):
    shards = [s for s in meta["splits"][split]["shards"] if s["num_examples"] > 0]
    paths = [os.path.join(cache_dir, s["file"]) for s in shards]
    return paths, [s["num_examples"] for s in shards]


def shard_paths(meta, cache_dir, split):
    return _shards(meta, cache_dir, split)[0]


def _shard_records(path, expected):
    """One shard's records; a damaged shard raises an error that names it.

    TensorFlow's own error for a bad record ("corrupted record at 1234")
    does not say which file. Here a damaged record ends the shard early
    instead, and the count is checked against the metadata when the shard
    ends: `InvalidArgumentError` with the shard's path and what to run.
    """
    # `ignore_errors` would retry a missing file forever, so a missing shard
    # is caught first, with its own message.
    present = tf.debugging.Assert(
        tf.equal(tf.size(tf.io.matching_files(path)), 1),
        [tf.strings.join(["Shard ", path, " is missing. Run `keras-datum verify`."])],
    )
    with tf.control_dependencies([present]):
        path = tf.identity(path)
    # Records are counted in blocks: per-record bookkeeping would cost more
    # than reading the records.
    blocks = tf.data.TFRecordDataset(path).ignore_errors().batch(COUNT_BLOCK)
    blocks = blocks.map(lambda block: (block, False)).concatenate(
        tf.data.Dataset.from_tensors((tf.zeros([0], tf.string), True))
    )

    def fail(seen):
        message = tf.strings.join(
            [
                "Shard ", path, " is damaged: it yielded ", tf.strings.as_string(seen),
                " of its ", tf.strings.as_string(expected), " records. Run "
                "`keras-datum verify` on the cache, then export again.",
            ]
        )
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(seen)

    def count(seen, element):
        block, is_end = element
        seen = seen + tf.size(block, out_type=tf.int64)
        seen = tf.cond(
            is_end & tf.not_equal(seen, expected), lambda: fail(seen), lambda: seen
        )
        return seen, (block, is_end)

    blocks = blocks.scan(tf.constant(0, tf.int64), count)
    blocks = blocks.filter(lambda block, is_end: tf.logical_not(is_end))
    return blocks.map(lambda block, is_end: block).unbatch()


def _serialized(paths, counts, num_examples, shuffle_files, seed, deterministic, whole):
    """The split's serialized examples: shard files interleaved in parallel.

    `whole` is False when each reader sees only part of the split (tf.data
    service workers), so the split's count cannot be asserted.
    """
    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant(paths, dtype=tf.string), tf.constant(counts, dtype=tf.int64))
    )
    if shuffle_files and len(paths) > 1:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    # Shard names are plain, but a cache folder with glob characters in its
    # path cannot be checked with `matching_files`: it reads shards plainly.
    checked = not any(c in path for path in paths for c in "*?[]\\")
    dataset = files.interleave(
        _shard_records if checked else lambda path, count: tf.data.TFRecordDataset(path),
        cycle_length=max(1, min(len(paths), MAX_INTERLEAVE)),
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )
    if not whole:
        return dataset
    # The metadata knows the exact count: Keras then shows epoch progress,
    # and a shard that lost records fails loudly instead of shrinking an epoch.
    return dataset.apply(tf.data.experimental.assert_cardinality(num_examples))


_PIXEL_KEYS = ("images", "segmentation_masks")


def _pixels_as(dtype):
    def cast(inputs):
        inputs = dict(inputs)
        for key in _PIXEL_KEYS:
            if key in inputs:
                value = inputs[key]
                if dtype == tf.uint8:
                    value = tf.round(tf.clip_by_value(value, 0.0, 255.0))
                inputs[key] = tf.cast(value, dtype)
        return inputs

    return cast


# The automatic in-memory cache may take this fraction of the memory that is
# available when the split is built: enough for most datasets that fit at all,
# while leaving the model, the shuffle buffer and other processes their room.
DEFAULT_CACHE_FRACTION = 0.25


def available_memory():
    """Bytes of memory available now (Linux's MemAvailable, else free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_cache_budget():
    return int(available_memory() * DEFAULT_CACHE_FRACTION)


def decoded_bytes(meta, split, options):
    """Memory the decoded split takes at the target size, as uint8."""
    info = meta["splits"][split]
    if "image" not in meta["features"]:
        return info.get("characters", 0) + 64 * info["num_examples"]
    height, width = options["image_size"]
    channels = images.CHANNELS[options["color_mode"]] + ("mask" in meta["features"])
    return info["num_examples"] * (height * width * channels + 64)


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
    `count`-th example when there are fewer files than workers).
    """
    if data_service:
        # Each worker gets other shards in every epoch: a worker-side cache
        # would hold the wrong examples.
        cache = False
    paths, counts = _shards(meta, cache_dir, split)
    # Each input pipeline (worker) reads its own files; a split with fewer
    # files than workers (fewer examples than workers) is shared by example.
    by_example = shard_subset is not None and len(paths) < shard_subset[1]
    if shard_subset is not None and not by_example:
        index, count = shard_subset
        paths, counts = paths[index::count], counts[index::count]
    deterministic = not shuffle or seed is not None
    num_examples = sum(counts)
    buffer = shuffle_buffer_size or min(DEFAULT_SHUFFLE_BUFFER, max(1, num_examples))
    # Sharing by example needs the same record order on every worker.
    dataset = _serialized(
        paths, counts, num_examples, shuffle and not cache and not by_example, seed,
        deterministic or by_example, whole=not data_service and not by_example,
    )
    if by_example:
        dataset = dataset.shard(shard_subset[1], shard_subset[0])

    def decode(serialized):
        return decode_example(serialized, meta, options)

    batch_decoder = _batch_decoder(meta, split, options)

    def decoded(dataset, then=lambda inputs: inputs):
        """Serialized examples -> decoded dicts, with `then` applied (fused)."""
        if batch_decoder is not None:
            return batch_decoder(dataset, deterministic, then)
        return dataset.map(
            lambda s: then(decode(s)), num_parallel_calls=AUTOTUNE, deterministic=deterministic
        )

    if cache:
        # Decode once, keep uint8 pixels at the target size in memory, and
        # shuffle the decoded elements: later epochs decode nothing. The
        # cast back to float32 waits for the batch when nothing per example
        # needs floats, so a cached epoch costs a few operations per batch.
        to_uint8 = _pixels_as(tf.uint8)
        dataset = decoded(dataset, then=to_uint8).cache()
    if shuffle:
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if not cache:
        dataset = decoded(dataset)
    for augmentation in (augment, batch_augment):
        if augmentation is not None and seed is not None:
            augmentation.reseed(seed)
    labels_spec = dataset.element_spec.get("labels")
    int_labels = labels_spec is not None and labels_spec.dtype.is_integer
    to_float = _pixels_as(tf.float32)

    def augmented(augmentation):
        """`augmentation` on what the layers take: float32 pixels (cached ones
        are uint8) and float32 labels. KerasCV layers mix float and integer
        labels across their branches (RandAugment fails on int32); class
        indices survive the round trip exactly."""

        def apply(inputs):
            inputs = to_float(inputs)
            if int_labels:
                inputs["labels"] = tf.cast(inputs["labels"], tf.float32)
            return augmentation(inputs)

        return apply

    augment_calls = AUTOTUNE if seed is None else None
    if augment is not None:
        dataset = dataset.map(augmented(augment), num_parallel_calls=augment_calls)
    problem = problems.get(meta["problem"])
    if hasattr(problem, "batch"):
        dataset = problem.batch(dataset, batch_size, options)
    elif batch_size is not None:
        dataset = dataset.batch(
            batch_size, num_parallel_calls=AUTOTUNE, deterministic=deterministic
        )
    if batch_augment is not None:
        dataset = dataset.map(augmented(batch_augment), num_parallel_calls=augment_calls)
    to_keras = problem.to_keras

    def finish(inputs):
        inputs = to_float(inputs)  # Cached uint8 pixels, unless cast earlier.
        if "images" in inputs:
            inputs["images"] = tf.cast(inputs["images"], image_dtype)
        if int_labels:
            inputs["labels"] = tf.cast(inputs["labels"], labels_spec.dtype)
        return to_keras(inputs)

    dataset = dataset.map(finish, num_parallel_calls=AUTOTUNE)
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
    if shard_policy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = shard_policy
        dataset = dataset.with_options(options)
    return dataset.prefetch(AUTOTUNE)
