"""How fast a dataset's split reads on this machine, and what bounds it.

`keras-datum benchmark` prints this for a user's own folder: whether the
decoded cache is on, how fast the stored images decode from memory, and how
fast `ds.train()` (or another split) yields batches, epoch by epoch. It is the
measurement behind the levers of `docs/performance.md`: an epoch near the
decode rate is bounded by decoding (a smaller `max_image_side` or the cache
helps), one far below it by something else.
"""

import dataclasses
import os
import time

import tensorflow as tf

from keras_datum import decoding
from keras_datum import images
from keras_datum import memory
from keras_datum import metadata
from keras_datum import problems
from keras_datum import storage

# Records decoded from memory for the decode rate: enough to last a few
# seconds at 224 pixels on a small machine, and to fill every core; and at
# most about this many bytes of them (originals of 12-megapixel photos are
# 5 MB each).
DECODE_RECORDS = 2000
DECODE_BYTES = 256 * 1024 * 1024


def cores():
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Not Linux.
        return os.cpu_count() or 1


def _batch_size(element):
    # `(x, y)`, or `x` alone when there are no labels; `x` a tensor or a dict.
    x = element[0] if isinstance(element, tuple) else element
    return int((x if isinstance(x, tf.Tensor) else tf.nest.flatten(x)[0]).shape[0])


def time_epoch(dataset):
    """One pass over `dataset`: `{"images", "seconds", "images_per_second",
    "first_batch_seconds", "cores_busy"}`; the first batch's wait counts in
    the epoch. `cores_busy` is this process's CPU time over the epoch's wall
    time: near the core count, the epoch was bounded by the CPU; near 1 on a
    machine with more cores, by one thread (or the machine ran it on one core).
    """
    start, cpu = time.perf_counter(), time.process_time()
    first = None
    count = 0
    for element in dataset:
        if first is None:
            first = time.perf_counter() - start
        count += _batch_size(element)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    return {
        "images": count,
        "seconds": seconds,
        "images_per_second": count / seconds if seconds > 0 else 0.0,
        "first_batch_seconds": first,
        "cores_busy": cpu / seconds if seconds > 0 else 0.0,
    }


def decode_rate(meta, cache_dir, split, options, batch_size, records=None):
    """Images per second of the split's own decoding and resizing, from
    serialized records already in memory, in parallel on every core: no
    reading, checking, shuffling, caching or casting. `None` for text.

    The faster of two passes over at most `records` records (the first also
    builds the functions). The pipeline decodes small raw-pixel images a
    block at a time, faster than this one-at-a-time rate. `records`
    defaults to `DECODE_RECORDS`, or fewer when they would take more than
    `DECODE_BYTES` of memory.
    """
    if "image" not in meta.features:
        return None
    paths = meta.splits[split].shard_paths(cache_dir)
    if not paths:
        return None
    size = sum(storage.getsize(path) for path in paths)
    record_bytes = max(1, size // meta.splits[split].num_examples)
    records = records or max(1, min(DECODE_RECORDS, DECODE_BYTES // record_bytes))
    serialized = [r for r in tf.data.TFRecordDataset(paths).take(records).batch(records)]
    if not serialized:
        return None
    options = dataclasses.replace(
        options, stored_images=images.stored_images(meta.splits[split].stats)
    )
    dataset = (
        tf.data.Dataset.from_tensor_slices(serialized[0])
        .map(
            lambda s: decoding.decode_example(s, meta, options)["images"],
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    best = None
    for _ in range(2):
        start = time.perf_counter()
        count = sum(int(batch.shape[0]) for batch in dataset)
        rate = count / (time.perf_counter() - start)
        best = rate if best is None else max(best, rate)
    return {"images_per_second": best, "records": int(serialized[0].shape[0])}


def keras_rate(ds, meta):
    """One epoch of `keras.utils.image_dataset_from_directory` over the whole
    source folder, with the dataset's image options: `time_epoch`'s figures,
    or `{"not_applicable": why}` for sources it cannot read."""
    if meta.layout != "class_folders" or meta.problem != problems.classification.NAME:
        return {
            "not_applicable": f"it reads image class folders, and this source is "
            f"{meta.problem} in the {meta.layout!r} layout"
        }
    invalid = meta.invalid_count
    if invalid:
        return {
            "not_applicable": f"{invalid} files of the folder are not valid images "
            "(see `keras-datum info`), and one stops Keras's epoch"
        }
    import keras

    options = ds.read_options
    try:
        dataset = keras.utils.image_dataset_from_directory(
            ds.source,
            image_size=options.image_size,
            batch_size=ds.global_batch_size,
            color_mode=options.color_mode,
            interpolation=options.interpolation,
            crop_to_aspect_ratio=options.crop_to_aspect_ratio,
            pad_to_aspect_ratio=bool(options.pad_to_aspect_ratio),
            follow_links=ds.config.export.follow_links,
            shuffle=True,
            seed=0,
            verbose=False,
        )
        return time_epoch(dataset)
    except (ValueError, tf.errors.OpError) as e:
        # Files Keras cannot read (formats it does not list, such as WebP
        # or TIFF, which keras_datum converts): the figures above still stand.
        message = str(getattr(e, "message", e)).strip().splitlines()[0]
        return {"not_applicable": f"Keras failed on this folder: {message}"}


def measure(ds, split="train", epochs=3, keras=False):
    """Exports `ds` if needed, then times what reading `split` costs.

    Returns:
        A dict: the split and its size, the batch size, the cores, whether
        this call exported and how long that (or the cache check) took, whether the
        decoded cache is on (with the split's decoded size and the budget),
        the decode rate from memory (`decode_rate`), each epoch's
        `time_epoch` figures, in order, and with `keras`, one epoch of
        `keras.utils.image_dataset_from_directory` over the source folder
        (`keras_rate`; `None` without).
    """
    if epochs < 1:
        raise ValueError(f"`epochs` must be at least 1. Received: epochs={epochs}")
    if ds.global_batch_size is None:
        raise ValueError("Timing epochs needs batches: `batch_size` must not be None.")
    if split not in ("train", "val", "test"):
        raise ValueError(f"`split` must be 'train', 'val' or 'test'. Received: split={split!r}")
    start = time.perf_counter()
    meta = metadata.Metadata.from_json(ds.export())
    export_seconds = time.perf_counter() - start
    # Raises the dataset's own error for a split it does not have.
    dataset = {"train": ds.train, "val": ds.val, "test": ds.test}[split]()
    cached, budget = memory.decoded_cache(ds.config.runtime, meta, split, ds.read_options)
    decode = decode_rate(meta, ds.cache_dir, split, ds.read_options, ds.global_batch_size)
    return {
        "split": split,
        "examples": meta.splits[split].num_examples,
        "batch_size": ds.global_batch_size,
        "cores": cores(),
        # A datum export is read in place: nothing is ever written.
        "exported": ds.exported,
        "in_place": meta.in_place,
        "export_seconds": export_seconds,
        "cache": {
            "on": cached,
            "decoded_bytes": memory.decoded_bytes(meta, split, ds.read_options),
            "budget_bytes": budget,
        },
        "decode": decode,
        "epochs": [time_epoch(dataset) for _ in range(epochs)],
        "keras": keras_rate(ds, meta) if keras else None,
    }


def report(result):
    """`measure`'s result as lines of text."""
    mb = 1024 * 1024
    decoded_cache = result["cache"]
    lines = [
        (f"{result['split']}: {result['examples']} examples, batches of "
        f"{result['batch_size']}, {result['cores']} cores"),
        f"export: {result['export_seconds']:.1f} s"
        if result["exported"]
        else "export: none, a datum export is read in place"
        if result.get("in_place")
        else f"export: none, the cache was up to date (checked in {result['export_seconds']:.1f} s)",
    ]
    budget = (
        "" if decoded_cache["budget_bytes"] is None
        else f" of a {decoded_cache['budget_bytes'] / mb:,.0f} MB budget"
    )
    size = f"{decoded_cache['decoded_bytes'] / mb:,.0f} MB{budget}"
    if decoded_cache["on"]:
        lines.append(
            f"decoded cache: on, {size}: "
            "epochs after the first decode nothing"
        )
    else:
        lines.append(
            f"decoded cache: off ({size}): "
            "every epoch decodes"
        )
    decode = result["decode"]
    if decode is not None:
        lines.append(
            f"decoding from memory: {decode['images_per_second']:,.0f} images/s "
            f"({decode['records']} records, no reading, shuffling or caching)"
        )
    keras = result.get("keras")
    if keras is not None and "not_applicable" in keras:
        lines.append(f"keras.utils.image_dataset_from_directory: not timed: {keras['not_applicable']}")
        keras = None
    elif keras is not None:
        lines.append(
            f"keras.utils.image_dataset_from_directory: {keras['images_per_second']:,.0f} "
            f"images/s (one epoch over all {keras['images']} files)"
        )
    for number, epoch in enumerate(result["epochs"], 1):
        line = (
            f"epoch {number}: {epoch['images_per_second']:,.0f} images/s, "
            f"{epoch['seconds']:.2f} s, first batch after {epoch['first_batch_seconds'] or 0:.2f} s, "
            f"{epoch['cores_busy']:.1f} cores busy"
        )
        ratios = [
            f"{epoch['images_per_second'] / reference['images_per_second']:.2f}x {name}"
            for name, reference in (("decoding", decode), ("Keras", keras))
            if reference is not None and reference["images_per_second"] > 0
        ]
        if ratios:
            line += f" ({', '.join(ratios)})"
        lines.append(line)
    return lines
