"""Writing a source layout into validated, shuffled, sharded TFRecords.

The export:

1. carves a validation split when the source has none (deterministic and
   stratified by class);
2. shuffles each split with the seed, spreading every class evenly, so that
   every shard mixes all classes;
3. reads, validates and (rarely) converts the images on every CPU core, in a
   bounded window, so the dataset is never held in memory;
4. writes the shards, the invalid-file report and, last, `metadata.json` into a
   temporary folder, and renames it into place. A crash at any point leaves
   either the previous cache or no cache, never a half-written one.
"""

import collections
import datetime
import functools
import math
import multiprocessing
import os
import shutil
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from keras_datum import cache
from keras_datum import encode
from keras_datum import problems
from keras_datum import sources
from keras_datum.version import __version__

# Big datasets get shards of about this size: large enough for sequential
# reads, small enough that many readers can share a split.
TARGET_SHARD_BYTES = 128 * 2**20
# Small datasets still get up to 16 shards (so reading interleaves and
# distributed workers each get files), but never fewer than this many
# examples per shard.
MIN_EXAMPLES_PER_SHARD = 64
MAX_SMALL_SHARDS = 16
# Splits this big are encoded in worker processes; smaller ones in threads.
PROCESS_POOL_MIN_EXAMPLES = 2000
# Examples in flight per worker process.
PROCESS_WINDOW_PER_WORKER = 1024
# Images in flight per worker thread: enough to hide file latency, few enough
# that memory stays flat.
WINDOW_PER_WORKER = 8
SPLIT_STREAMS = {"train": 0, "val": 1, "test": 2}
SOURCE_FEATURES = {"source/filename": {"dtype": "string", "shape": []}}


def num_shards(num_examples, num_bytes):
    by_size = math.ceil(num_bytes / TARGET_SHARD_BYTES)
    by_count = min(MAX_SMALL_SHARDS, num_examples // MIN_EXAMPLES_PER_SHARD)
    return max(1, by_size, by_count)


def carve_validation(records, validation_split, seed):
    """Splits `records` into (train, val), stratified by `record.stratum`.

    Each stratum (class) gives `round(len * validation_split)` examples to
    validation, chosen by a generator seeded with `seed`. Both lists keep
    the source order. The same records and seed give the same split in any
    process.
    """
    rng = np.random.default_rng(seed)
    strata = collections.defaultdict(list)
    for index, record in enumerate(records):
        strata[record.stratum].append(index)
    val_indices = set()
    for members in strata.values():  # In order of first appearance.
        # Never take a class's last training example.
        count = min(int(round(len(members) * validation_split)), len(members) - 1)
        chosen = rng.permutation(len(members))[:count]
        val_indices.update(members[i] for i in chosen)
    train = [r for i, r in enumerate(records) if i not in val_indices]
    val = [r for i, r in enumerate(records) if i in val_indices]
    return train, val


def plan_splits(layout, validation_split, seed):
    """The records of each split, after carving a validation split if needed."""
    splits = dict(layout.splits)
    carved = False
    if "val" not in splits and validation_split:
        splits["train"], splits["val"] = carve_validation(
            splits["train"], validation_split, seed
        )
        carved = True
    return {s: splits[s] for s in ("train", "val", "test") if s in splits}, carved


def plan_shards(records, count, rng):
    """Shuffles `records` and deals them to `count` shards, class by class.

    Each class is shuffled and dealt round-robin, continuing where the
    previous class stopped, so shard lengths differ by at most one and every
    class with at least `count` examples is in every shard. The write order
    interleaves the classes in proportion: the j-th member of a class of n
    gets the key `(j + u) / n`, `u` uniform in [0, 1). Records without a class
    form one stratum, for which this is a plain shuffle.

    Returns:
        `(order, shard_of)`: the indices in write order, and each index's shard.
    """
    strata = collections.defaultdict(list)
    for index, record in enumerate(records):
        strata[record.stratum].append(index)
    keys = np.empty(len(records))
    shard_of = np.empty(len(records), dtype=np.int64)
    start = 0
    for members in strata.values():
        shuffled = rng.permutation(members)
        size = len(members)
        keys[shuffled] = (np.arange(size) + rng.uniform(size=size)) / size
        shard_of[shuffled] = (start + np.arange(size)) % count
        start += size
    return np.argsort(keys, kind="stable"), shard_of


def encode_example(problem_name, options, spec, record):
    """Reads, validates and serializes one record (in a thread or a process).

    Returns:
        `(serialized example, stats)`, or `(InvalidExampleError, None)`.
    """
    problem = problems.get(problem_name)
    try:
        features, stats = problem.encode(record, options)
    except encode.InvalidExampleError as e:
        return e, None
    return serialize(record, features, spec), stats


def _encoded_stream(encode_one, records, workers):
    """`encode_one` over `records`, in order, on all cores.

    Big splits use forked worker processes: Pillow's Python-side parsing
    and the protobuf building hold the GIL, so threads stop scaling once
    images are small. The workers touch no TensorFlow runtime (only Pillow,
    NumPy and the `tf.train.Example` protobuf class), which is what makes
    forking a process that has TensorFlow loaded safe. Small splits, where
    starting processes would cost more than it saves, use threads: Pillow
    releases the GIL while it decodes.
    """
    if (
        workers > 1
        and len(records) >= PROCESS_POOL_MIN_EXAMPLES
        and "fork" in multiprocessing.get_all_start_methods()
    ):
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            chunk = max(1, min(256, len(records) // (workers * 16)))
            # Windows bound what is in flight: `imap` alone would queue the
            # whole split and let results pile up faster than they are written.
            window = workers * PROCESS_WINDOW_PER_WORKER
            for start in range(0, len(records), window):
                yield from pool.imap(encode_one, records[start : start + window], chunksize=chunk)
    else:
        yield from _ordered_map(encode_one, records, workers)


class SplitStats:
    """Adds up the stats that a problem's `encode` returns for each example.

    `height`/`width` give image size statistics; other integers are summed
    (boxes clipped, boxes dropped); lists of ints are counted per value
    (objects per class); sets are merged (mask values seen).
    """

    def __init__(self):
        self.sizes = {"height": [], "width": []}
        self.sums = collections.Counter()
        self.counts = collections.defaultdict(collections.Counter)
        self.unions = collections.defaultdict(set)

    def add(self, stats):
        for key, value in stats.items():
            if key in self.sizes:
                self.sizes[key].append(value)
            elif isinstance(value, int):
                self.sums[key] += value
            elif isinstance(value, list):
                self.counts[key].update(value)
            else:
                self.unions[key].update(value)

    def as_dict(self, num_classes):
        out = {"image_sizes": _size_stats(self.sizes["height"], self.sizes["width"])}
        out.update(self.sums)
        for key, counter in self.counts.items():
            size = max(num_classes, max(counter, default=-1) + 1)
            out[key] = [counter[i] for i in range(size)]
        for key, values in self.unions.items():
            out[key] = sorted(int(v) for v in values)
        return out


def _ordered_map(fn, items, workers):
    """`map(fn, items)` on a thread pool, in order, at most a window ahead.

    Pillow releases the GIL while decoding, so threads use every core.
    """
    window = workers * WINDOW_PER_WORKER
    pending = collections.deque()
    with ThreadPoolExecutor(workers) as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _feature(values, dtype):
    if dtype == "string":
        values = [values] if isinstance(values, bytes) else values
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if dtype == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def serialize(record, features, spec):
    """One `tf.train.Example`: the problem's features plus the source file name.

    `spec` (the feature spec) gives each feature's type, so that an empty
    list (an image without boxes) is still stored with the right type.
    """
    features = {name: _feature(v, spec[name]["dtype"]) for name, v in features.items()}
    features["source/filename"] = _feature(record.relpath.encode("utf-8"), "string")
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString()


def _write_split(
    problem, info, export_options, split, records, folder, seed, on_invalid, workers, progress,
    num_classes,
):
    """Writes one split's shards; returns (split metadata, invalid entries).

    Shards are written one after the other, each in the mixed order, so only
    one file is open at a time however many shards a big split needs.
    """
    count = num_shards(len(records), _split_bytes(records))
    stream = SPLIT_STREAMS[split]  # Each split gets its own seeded stream.
    rng = np.random.default_rng([seed, stream])
    order, shard_of = plan_shards(records, count, rng)
    rank = np.empty(len(records), dtype=np.int64)
    rank[order] = np.arange(len(records))
    write_order = np.lexsort((rank, shard_of))
    names = [cache.shard_name(split, i, count) for i in range(count)]
    lengths = [0] * count
    invalid = []
    spec = problem.features(info)
    stats = SplitStats()
    class_counts = collections.Counter()
    written = 0
    writer, open_shard = None, None
    ordered = [records[i] for i in write_order]
    encode_one = functools.partial(encode_example, problem.NAME, export_options, spec)
    results = _encoded_stream(encode_one, ordered, workers)
    try:
        for index, (result, example_stats) in zip(write_order, results):
            record, shard = records[index], shard_of[index]
            progress.update(1)
            if isinstance(result, encode.InvalidExampleError):
                if on_invalid == "raise":
                    raise type(result)(
                        f"Invalid example {record.path!r}: {result}. Pass "
                        "on_invalid='skip' to leave such files out."
                    )
                invalid.append(
                    {"split": split, "file": record.relpath, "reason": str(result)}
                )
                continue
            if shard != open_shard:
                if writer is not None:
                    writer.close()
                writer = tf.io.TFRecordWriter(os.path.join(folder, names[shard]))
                open_shard = shard
            writer.write(result)
            class_counts[record.stratum] += 1
            lengths[shard] += 1
            written += 1
            stats.add(example_stats)
    finally:
        results.close()  # Stops the workers at once when the export fails.
        if writer is not None:
            writer.close()
    for name, length in zip(names, lengths):
        if length == 0:  # Every listed shard exists, even an empty one.
            tf.io.TFRecordWriter(os.path.join(folder, name)).close()
    info = {
        "num_examples": written,
        "class_counts": [class_counts[i] for i in range(num_classes)]
        if num_classes
        else None,
        "shards": [{"file": n, "num_examples": k} for n, k in zip(names, lengths)],
        **stats.as_dict(num_classes),
    }
    return info, invalid


def _split_bytes(records):
    """Bytes a split will take: each file once, and JSON texts by length."""
    texts = [r.annotation for r in records if isinstance(r.annotation, str)]
    files = {r.path for r in records if not isinstance(r.annotation, str)}
    return sum(sources.file_size(p) for p in files) + sum(len(t) for t in texts)


def _write_split_or_oserror(*args):
    """`_write_split`, with TensorFlow's write errors (disk full, permission
    denied) turned into the `OSError` a Python user expects."""
    try:
        return _write_split(*args)
    except tf.errors.OpError as e:
        raise OSError(f"Cannot write the cache: {e.message}") from e


def _size_stats(heights, widths):
    if not heights:
        return {}
    return {
        name: {"min": int(np.min(v)), "mean": float(np.mean(v)), "max": int(np.max(v))}
        for name, v in (("height", heights), ("width", widths))
    }


def check_cache_target(cache_dir):
    """Refuses to replace a folder that is not a keras_datum cache.

    Raises:
        ValueError: `cache_dir` holds files that keras_datum did not write.
    """
    if (
        os.path.isdir(cache_dir)
        and os.listdir(cache_dir)
        and not cache.is_cache_folder(cache_dir)
    ):
        raise ValueError(
            f"`cache_dir` {cache_dir!r} exists and is not a keras_datum cache "
            "(it has no metadata.json); refusing to overwrite it. Choose an "
            "empty or new folder."
        )
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise ValueError(f"`cache_dir` {cache_dir!r} exists and is not a folder.")


def remove_leftovers(cache_dir):
    """Removes temporary folders of exports that died (call under the lock)."""
    parent = os.path.dirname(cache_dir.rstrip(os.sep)) or "."
    base = os.path.basename(cache_dir.rstrip(os.sep))
    if not os.path.isdir(parent):
        return
    for name in os.listdir(parent):
        if name.startswith(base + ".tmp-") or name.startswith(base + ".old-"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _commit(tmp_dir, cache_dir):
    """Moves the finished export into place, replacing an older cache."""
    old = None
    if os.path.isdir(cache_dir):
        if cache.is_cache_folder(cache_dir):
            old = f"{cache_dir.rstrip(os.sep)}.old-{uuid.uuid4().hex[:8]}"
            os.replace(cache_dir, old)
        else:
            os.rmdir(cache_dir)  # Empty, as check_cache_target ensured.
    os.replace(tmp_dir, cache_dir)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def export_layout(
    layout,
    root,
    cache_dir,
    *,
    fingerprint,
    export_options,
    on_invalid="skip",
    verbose=True,
):
    """Writes `layout` into `cache_dir`; returns the metadata dict.

    Call it holding `cache.export_lock(cache_dir)`.

    Raises:
        ValueError: no valid image was found, or an invalid one was found
            with `on_invalid="raise"` (the message names the file).
        OSError: the cache location cannot be written (disk full, no
            permission); no partial cache is left behind.
    """
    check_cache_target(cache_dir)
    remove_leftovers(cache_dir)
    seed = export_options["seed"]
    splits, carved = plan_splits(layout, export_options["validation_split"], seed)
    problem = problems.get(layout.problem)
    tmp_dir = f"{cache_dir.rstrip(os.sep)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp_dir)
    workers = os.cpu_count() or 1
    total = sum(len(r) for r in splits.values())
    spec = layout.info["label_spec"]
    num_classes = spec["num_classes"] if spec["type"] == "class" else 0
    try:
        split_info, invalid = {}, []
        with tqdm(
            total=total, desc="Exporting", unit="img", disable=not verbose
        ) as progress:
            for split, records in splits.items():
                split_info[split], bad = _write_split_or_oserror(
                    problem,
                    layout.info,
                    export_options,
                    split, records, tmp_dir, seed, on_invalid, workers, progress,
                    num_classes,
                )
                invalid += bad
        if split_info["train"]["num_examples"] == 0:
            first = (
                f" (first: {invalid[0]['file']!r}: {invalid[0]['reason']})" if invalid else ""
            )
            raise ValueError(
                f"No valid training example was found in {root!r}: "
                f"{len(splits['train'])} files, all invalid or carved into val{first}."
            )
        cache.write_json(os.path.join(tmp_dir, cache.REPORT_FILE), invalid)
        meta = {
            "schema_version": cache.SCHEMA_VERSION,
            "keras_datum_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "source": os.path.abspath(root),
            "problem": layout.problem,
            "layout": layout.name,
            "class_names": layout.info["class_names"],
            "label_spec": layout.info["label_spec"],
            "splits": split_info,
            "features": {**SOURCE_FEATURES, **problem.features(layout.info)},
            "export_options": export_options,
            "validation_carve": {
                "carved": carved,
                "validation_split": export_options["validation_split"],
                "seed": seed,
                "stratified_by_class": carved
                and layout.info["label_spec"]["type"] == "class",
            },
            "source_fingerprint": fingerprint,
            "invalid_files": {"count": len(invalid), "report": cache.REPORT_FILE},
        }
        cache.write_json(os.path.join(tmp_dir, cache.METADATA_FILE), meta)
        _commit(tmp_dir, cache_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if invalid:
        warnings.warn(
            f"{len(invalid)} invalid files were left out of the export; see "
            f"{os.path.join(cache_dir, cache.REPORT_FILE)} for each file and "
            "its reason.",
            stacklevel=3,
        )
    return meta
