"""Writing a source layout into validated, shuffled, sharded TFRecords.

The export:

1. carves a validation split when the source has none (deterministic and
   stratified by class);
2. shuffles each split with the seed, spreading every class evenly, so that
   every shard mixes all classes;
3. reads, validates and (rarely) converts the images on every CPU core, one
   example at a time per worker, so the dataset is never held in memory: big
   exports in forked processes that each write whole shards, small ones in
   threads;
4. writes the shards, the invalid-file report and, last, `metadata.json` into a
   temporary folder, and renames it into place. A crash at any point leaves
   either the previous cache or no cache, never a half-written one.
"""

import collections
import datetime
import functools
import gc
import math
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from keras_datum import cache
from keras_datum import encode
from keras_datum import notices
from keras_datum import problems
from keras_datum import shard_writer
from keras_datum import sources
from keras_datum import storage
from keras_datum import store
from keras_datum import tfds_metadata
from keras_datum.version import __version__

# Big datasets get shards of about this size: large enough for sequential
# reads, small enough that many readers can share a split.
TARGET_SHARD_BYTES = 128 * 2**20
# Small datasets still get up to 16 shards (so reading interleaves and
# distributed workers each get files), but never fewer than this many
# examples per shard.
MIN_EXAMPLES_PER_SHARD = 64
MAX_SMALL_SHARDS = 16
# Exports this big are written by worker processes, a shard at a time;
# smaller ones in threads. Measured on 2 cores (paired exports): at 1,000
# files processes win (by 7% for 80 KB JPEGs, 40% for tiny PNGs); at 500,
# threads win for JPEGs (Pillow decodes them without the GIL).
PROCESS_POOL_MIN_EXAMPLES = 1000
# Images in flight per worker thread: enough to hide file latency, few enough
# that memory stays flat.
WINDOW_PER_WORKER = 8
SPLIT_STREAMS = {"train": 0, "val": 1, "test": 2}


def num_shards(num_examples, num_bytes, min_shards=1):
    """Shards for a split: by size, by count, and at least `min_shards` (one
    per training worker, so each reads its own files) when there are enough
    examples."""
    by_size = math.ceil(num_bytes / TARGET_SHARD_BYTES)
    by_count = min(MAX_SMALL_SHARDS, num_examples // MIN_EXAMPLES_PER_SHARD)
    count = max(1, by_size, by_count, min(min_shards, num_examples))
    if 1 < min_shards <= num_examples:
        # A multiple of the workers, so each reads as many files.
        count = math.ceil(count / min_shards) * min_shards
    return count


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
        count = min(round(len(members) * validation_split), len(members) - 1)
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
        if not splits["val"]:
            notices.warn(
                f"validation_split={validation_split} carves no validation example "
                f"out of {len(splits['train'])}: each class gives "
                "round(its count * validation_split), and keeps one for training. "
                "The val split is empty; pass a larger validation_split, or None "
                "for no val split.",
            )
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


def plan_split(records, split, seed, min_shards=1, file_sizes=None):
    """The shards of one split: `[(shard file name, records in write order)]`.

    The plan depends only on the records, the seed and `min_shards`, so the
    local export and a Beam export of the same folder write the same shards.
    `file_sizes` (path -> bytes, from `cache.fingerprint`) saves a `stat`
    of every file; files it lacks are measured.
    """
    count = num_shards(len(records), _split_bytes(records, file_sizes or {}), min_shards)
    rng = np.random.default_rng([seed, SPLIT_STREAMS[split]])  # A stream per split.
    order, shard_of = plan_shards(records, count, rng)
    members = [[] for _ in range(count)]
    for index in order:
        members[shard_of[index]].append(records[index])
    return [(cache.shard_name(split, i, count), m) for i, m in enumerate(members)]


def split_metadata(shards, tallies, num_classes):
    """The split's metadata from its shards' tallies; and its invalid entries."""
    total = shard_writer.SplitStats()
    for tally in tallies:
        total.merge(tally)
    info = {
        "num_examples": total.num_examples,
        "class_counts": [total.class_counts[i] for i in range(num_classes)]
        if num_classes
        else None,
        "shards": [
            {"file": name, "num_examples": t.num_examples}
            for (name, _), t in zip(shards, tallies)
        ],
        **total.as_dict(num_classes),
    }
    return info, total.invalid


def _write_locally(problem, spec, export_options, plans, folder, on_invalid, progress):
    """Writes every split's shards from this process; returns their tallies.

    Memory: each of the `workers` (one per core) holds one image at a time,
    and an image whose decode and conversion take more than
    `encode.HUGE_IMAGE_BYTES` (256 MiB) holds the huge-image slot while they
    do (`encode.huge_image_slot`: a semaphore of one, shared by the threads
    or the forked workers). So the images take at most

        (workers - 1) x HUGE_IMAGE_BYTES + the largest image's peak

    on top of each worker's own footprint. The peak is estimated from the
    header at a measured cost per decoded pixel (`encode._PEAK_BYTES_PER_PIXEL`:
    4-5 bytes for an RGB PNG, 8-9 for a JPEG turned upright, at most 20), so
    a 12,000 x 12,000 PNG just under Pillow's decompression-bomb limit takes
    about 0.6 GiB, and two such images are never decoded at once.
    """
    workers = os.cpu_count() or 1
    total = sum(len(members) for shards in plans.values() for _, members in shards)
    first = next(members[0] for shards in plans.values() for _, members in shards if members)
    if (
        workers > 1
        and total >= PROCESS_POOL_MIN_EXAMPLES
        # Remote files are read and written through TensorFlow's file
        # systems, which a forked child must not touch.
        and not storage.is_url(first.path)
        and not storage.is_url(folder)
        and "fork" in multiprocessing.get_all_start_methods()
    ):
        return _write_in_processes(problem, spec, export_options, plans, folder, on_invalid,
                                   progress, workers)
    return _write_in_threads(problem, spec, export_options, plans, folder, on_invalid,
                             progress, workers)


def _write_in_processes(problem, spec, export_options, plans, folder, on_invalid, progress,
                        workers):
    """Forked worker processes each read, validate and write whole shards.

    Pillow's Python-side parsing holds the GIL, so threads stop scaling once
    images are small; and a worker that writes its own shards sends nothing
    back but the shard's tally. The workers touch no TensorFlow runtime
    (Pillow, NumPy and `records` only), which is what makes forking a
    process that has TensorFlow loaded safe. Each holds one example at a
    time, so memory stays flat however big the split.
    """
    tasks = [(split, shard) for split, shards in plans.items() for shard in shards]
    write = functools.partial(_write_task, problem.NAME, spec, export_options, on_invalid, folder)
    tallies = {split: [] for split in plans}
    # The workers inherit the huge-image slot made here, and so hold one
    # huge image at a time between them (see `_write_locally`).
    with encode.shared_huge_image_slot():
        # Objects that exist before the fork are left out of the children's
        # garbage collections, which would otherwise write to (and so copy)
        # every page of the parent's heap that they share.
        gc.freeze()
        try:
            pool = multiprocessing.get_context("fork").Pool(workers)
        finally:
            gc.unfreeze()
        with pool:
            # In plan order; an invalid file with on_invalid="raise" raises
            # here, and leaving the block stops the other workers at once.
            for (split, shard), tally in zip(tasks, pool.imap(write, tasks)):
                # TensorFlow's check, here in the parent, while the workers
                # write the next shards.
                tally = shard_writer.check_shard(problem.NAME, spec, export_options, on_invalid, folder,
                                    split, shard, tally)
                progress.update(tally.num_examples + len(tally.invalid))
                tallies[split].append(tally)
    return tallies


def _write_task(problem_name, spec, export_options, on_invalid, folder, task):
    split, shard = task
    return shard_writer.encode_shard(problem_name, spec, export_options, on_invalid, folder, split, shard)


def _write_in_threads(problem, spec, export_options, plans, folder, on_invalid, progress,
                      workers):
    """Threads read and validate; this thread writes the shards in order.

    Shards are written one after the other, so only one file is open at a
    time, while one stream of encoded examples per split keeps every core
    busy across shard boundaries. Pillow releases the GIL while it decodes.
    """
    encode_one = functools.partial(
        shard_writer.encode_example, problem.NAME, export_options,
        shard_writer.example_encoder(spec),
    )
    tallies = {}
    for split, shards in plans.items():
        ordered = [record for _, members in shards for record in members]
        results = _ordered_map(encode_one, ordered, workers)
        try:
            tallies[split] = [
                shard_writer.check_shard(
                    problem.NAME, spec, export_options, on_invalid, folder, split, shard,
                    shard_writer.write_shard(storage.join(folder, shard[0]), split, shard[1], results,
                                on_invalid, lambda: progress.update(1)),
                )
                for shard in shards
            ]
        finally:
            results.close()  # Stops the workers at once when the export fails.
    return tallies


def _split_bytes(records, file_sizes):
    """Bytes a split will take: each file once, and JSON texts by length."""
    texts = [r.annotation for r in records if isinstance(r.annotation, str)]
    files = {r.path for r in records if not isinstance(r.annotation, str)}
    sizes = (file_sizes[p] if p in file_sizes else sources.file_size(p) for p in files)
    return sum(sizes) + sum(len(t) for t in texts)


def export_layout(
    layout,
    root,
    cache_dir,
    *,
    fingerprint,
    export_options,
    file_sizes=None,
    on_invalid="skip",
    verbose=True,
    runner=None,
    beam_options=None,
):
    """Writes `layout` into `cache_dir`; returns the metadata dict.

    Call it holding `store.export_lock(cache_dir)`. With a `runner`, the
    shards are written by an Apache Beam pipeline (see `beam.py`); the plan,
    the metadata and the commit are the same either way. `file_sizes` (path
    -> bytes, filled by `cache.fingerprint`) spares the plan a second `stat`
    of every file.

    Raises:
        ValueError: no valid image was found, or an invalid one was found
            with `on_invalid="raise"` (the message names the file).
        OSError: the cache location cannot be written (disk full, no
            permission); no partial cache is left behind.
    """
    store.check_cache_target(cache_dir, replacing=True)
    store.remove_leftovers(cache_dir)
    splits, carved = plan_splits(layout, export_options.validation_split, export_options.seed)
    plans = {
        split: plan_split(records, split, export_options.seed, export_options.min_shards,
                          file_sizes)
        for split, records in splits.items()
    }
    problem = problems.get(layout.problem)
    feature_spec = problem.features(layout.info)
    tmp_dir = store.temporary_folder(cache_dir)
    try:
        tallies = _write_shards(
            problem, feature_spec, export_options, plans, tmp_dir, on_invalid,
            total=sum(len(r) for r in splits.values()), verbose=verbose,
            runner=runner, beam_options=beam_options,
        )
        spec = layout.info["label_spec"]
        num_classes = spec["num_classes"] if spec["type"] == "class" else 0
        split_info, invalid = {}, []
        for split, shards in plans.items():
            split_info[split], bad = split_metadata(shards, tallies[split], num_classes)
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
        meta = _metadata(
            layout, root, split_info, {**cache.SOURCE_FEATURES, **feature_spec},
            export_options, carved, fingerprint, len(invalid),
        )
        tfds_metadata.write_tfds_metadata(tmp_dir, meta)
        cache.write_json(os.path.join(tmp_dir, cache.METADATA_FILE), meta)
        storage.remove(os.path.join(tmp_dir, store.LEFTOVER_MARK))
        store.commit(tmp_dir, cache_dir)
    except BaseException:
        storage.rmtree(tmp_dir)
        raise
    if invalid:
        notices.warn(
            f"{len(invalid)} invalid files were left out of the export; see "
            f"{os.path.join(cache_dir, cache.REPORT_FILE)} for each file and "
            "its reason.",
        )
    return meta


def _write_shards(problem, feature_spec, export_options, plans, tmp_dir, on_invalid, *,
                  total, verbose, runner, beam_options):
    """Writes the planned shards into `tmp_dir`, in this process's workers
    or with a Beam `runner`; returns each split's tallies."""
    try:
        if runner is None:
            with tqdm(total=total, desc="Exporting", unit="img", disable=not verbose) as progress:
                return _write_locally(
                    problem, feature_spec, export_options, plans, tmp_dir,
                    on_invalid, progress,
                )
        from keras_datum import beam

        return beam.write_shards(
            problem.NAME, feature_spec, export_options, plans, tmp_dir,
            on_invalid, runner, beam_options, verbose,
        )
    except tf.errors.OpError as e:
        # TensorFlow's write errors (disk full, permission denied) as the
        # `OSError` a Python user expects.
        raise OSError(f"Cannot write the cache: {e.message}") from e


def _metadata(layout, root, split_info, features, export_options, carved, fingerprint,
              invalid_count):
    """The export's `metadata.json` content (see `cache.validate_metadata`)."""
    return {
        "schema_version": cache.SCHEMA_VERSION,
        "keras_datum_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "source": storage.abspath(root),
        "problem": layout.problem,
        "layout": layout.name,
        "class_names": layout.info["class_names"],
        "label_spec": layout.info["label_spec"],
        "splits": split_info,
        "features": features,
        "export_options": export_options.to_json(),
        "validation_carve": {
            "carved": carved,
            "validation_split": export_options.validation_split,
            "seed": export_options.seed,
            "stratified_by_class": carved and layout.info["label_spec"]["type"] == "class",
        },
        "source_fingerprint": fingerprint,
        "invalid_files": {"count": invalid_count, "report": cache.REPORT_FILE},
    }
