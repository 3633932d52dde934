"""Shard files -> serialized examples, for the read path (see `pipeline`).

The shard files of a split are interleaved in parallel a block of records at
a time; every shard's length is checked against the metadata as it ends,
and the cache's identity as each file opens (see `_guarded`). Everything
here is graph code: no Python runs per example.
"""

import os

import tensorflow as tf

from keras_datum import storage
from keras_datum import store

AUTOTUNE = tf.data.AUTOTUNE
MAX_INTERLEAVE = 16
# Records read and counted at a time (see `_shard_blocks`): at most this
# many, and about `BLOCK_BYTES` of them, so that the blocks in flight (a few
# per shard being interleaved) stay small whatever the records hold.
COUNT_BLOCK = 256
BLOCK_BYTES = 512 * 1024


def shards(meta, cache_dir, split):
    """`(paths, counts)`: the split's shard files that hold examples, in
    `cache_dir`, and the examples each holds."""
    info = meta.splits[split]
    return info.shard_paths(cache_dir), [s.num_examples for s in info.filled_shards]


def block_records(paths, counts):
    """Records per block: `BLOCK_BYTES` worth, judged from the first shard."""
    try:
        record_bytes = max(1, storage.getsize(paths[0]) // max(1, counts[0]))
    except (IndexError, OSError):  # No shard, or a missing one: reading says so.
        return COUNT_BLOCK
    return max(1, min(COUNT_BLOCK, BLOCK_BYTES // record_bytes))


def _literal_pattern(path):
    """`path` (a string tensor) as a `tf.io.matching_files` pattern that
    matches only itself (see `storage.glob_escape`)."""
    return tf.strings.regex_replace(path, storage.GLOB_SPECIAL, r"\\\1")


def _shard_blocks(path, expected, index, block):
    """One shard's records in blocks of `block`, then an end marker.

    Only native dataset ops here: this runs once per shard, and a function
    nested in it (a `map` or `scan`) would be instantiated for every shard,
    which costs more than reading a small shard. The counting happens once
    per split, in `_checked`.

    A damaged record ends the shard early (`ignore_errors`), and the count
    is checked against the metadata when the end marker passes: TensorFlow's
    own error for a bad record ("corrupted record at 1234") does not say
    which file, and a truncated file raises nothing at all.
    """
    # `ignore_errors` would retry a missing file forever, so a missing shard
    # is caught first, with its own message.
    present = tf.debugging.Assert(
        tf.equal(tf.size(tf.io.matching_files(_literal_pattern(path))), 1),
        [tf.strings.join(["Shard ", path, " is missing. Run `keras-datum verify`."])],
    )
    with tf.control_dependencies([present]):
        path = tf.identity(path)
    blocks = tf.data.TFRecordDataset(path).ignore_errors().batch(block)
    blocks = tf.data.Dataset.zip((blocks, tf.data.Dataset.from_tensors((index, False)).repeat()))
    end = tf.data.Dataset.from_tensors((tf.zeros([0], tf.string), (index, True)))
    return blocks.concatenate(end)


def _checked(blocks, paths, counts):
    """`_shard_blocks`' output, counted per shard; a shard that ends short, or
    goes past its count (checked on the block that does, before its records
    reach the split's count check, which names no file), raises
    `InvalidArgumentError` with its path and what to run.

    Each block comes with its shard's index and the index of its first
    record in the shard: where each record comes from, for `read_guard.naming_decode`."""
    paths = tf.constant(paths, tf.string)
    counts = tf.constant(counts, tf.int64)

    def count(seen, element):
        block, (index, is_end) = element
        seen = tf.tensor_scatter_nd_add(
            seen, [[index]], [tf.size(block, out_type=tf.int64)]
        )
        message = tf.strings.join(
            [
                "Shard ", paths[index], " is damaged: it yielded ",
                tf.strings.as_string(seen[index]), " of its ",
                tf.strings.as_string(counts[index]), (" records. Run "
                "`keras-datum verify` on the cache, then export again."),
            ]
        )
        ok = (tf.logical_not(is_end) | tf.equal(seen[index], counts[index])) & (
            seen[index] <= counts[index]
        )
        start = seen[index] - tf.size(block, out_type=tf.int64)
        with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
            return seen, (tf.identity(block), index, start)  # An end marker's block is empty.

    # Built inside a function: a `scan` made at the top adds its function
    # to the global graph, where it stays for good (about 1 MB for each
    # pipeline built: a KerasTuner search builds one per trial).
    return tf.data.Dataset.from_tensors(0).flat_map(
        lambda _: blocks.scan(tf.zeros_like(counts), count)
    )


def _guarded(files, guard):
    """Checks, as each shard file is opened, that the cache is still the
    export this pipeline was built on: another dataset sharing the cache
    folder may have exported another carve over it since, and its shards
    would be read as this one's (its validation images as training ones).
    `guard` is `(metadata path, export key)`, or `None` for no check."""
    if guard is None:
        return files

    def check(path, count, index):
        with tf.control_dependencies([still_the_export(guard)]):
            return tf.identity(path), count, index

    return files.map(check)


def still_the_export(guard):
    """An op (graph code) that fails, naming the cache, when the cache at
    `guard = (metadata path, export key)` is no longer that export."""
    message = store.stale_cache_message(os.path.dirname(guard[0]))
    return tf.debugging.Assert(is_the_export(guard), [message])


def is_the_export(guard):
    """Whether the cache at `guard = (metadata path, export key)` is still
    that export (graph code)."""
    metadata_path, key = guard
    # Missing for a moment while another export commits (two renames): not
    # checked then.
    return tf.cond(
        tf.size(tf.io.matching_files(_literal_pattern(metadata_path))) > 0,
        lambda: tf.equal(store.export_key(tf.io.read_file(metadata_path)), key),
        lambda: tf.constant(True),
    )


def serialized_blocks(paths, counts, shuffle_files, seed, deterministic, block, guard=None,
                       places=False):
    """The split's serialized examples in blocks (1-D string tensors): shard
    files interleaved in parallel, a block at a time, every shard's length
    checked (and the cache's identity, with `guard`: see `_guarded`). Empty
    blocks can occur. With `places`, each block comes as `(records, shard
    index, index of each record in its shard)`."""
    if not paths:
        # An empty split (a validation split that rounds to no file): no
        # blocks, but of the usual structure, so the rest builds as usual.
        empty = tf.data.TFRecordDataset(tf.constant([], tf.string)).batch(block)
        if places:
            empty = empty.map(lambda b: (b, tf.zeros_like(b, tf.int64), tf.zeros_like(b, tf.int64)))
        return empty
    indices = tf.range(len(paths), dtype=tf.int64)
    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant(paths, dtype=tf.string), tf.constant(counts, dtype=tf.int64), indices)
    )
    if shuffle_files and len(paths) > 1:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    files = _guarded(files, guard)
    cycle_length = max(1, min(len(paths), MAX_INTERLEAVE))
    blocks = files.interleave(
        lambda path, count, index: _shard_blocks(path, count, index, block),
        cycle_length=cycle_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )
    checked = _checked(blocks, paths, counts)
    if places:
        return checked.map(
            lambda records, index, start: (
                records,
                tf.fill(tf.shape(records), index),
                start + tf.range(tf.size(records, out_type=tf.int64)),
            )
        )
    return checked.map(lambda records, index, start: records)


def file_names(meta, cache_dir, split, guard=None):
    """Each example's `source/filename` (as the export wrote it, relative to
    the source), in the order an unshuffled read of `split` yields it: the
    same blocks of the same shards, interleaved the same way."""
    paths, counts = shards(meta, cache_dir, split)
    blocks = serialized_blocks(
        paths, counts, False, None, True, block_records(paths, counts), guard
    )
    spec = {"source/filename": tf.io.FixedLenFeature([], tf.string)}
    names = blocks.map(lambda block: tf.io.parse_example(block, spec)["source/filename"])
    return [
        name.decode("utf-8", "surrogateescape")
        for block in names.as_numpy_iterator()
        for name in block
    ]


def serialized(
    paths, counts, num_examples, shuffle_files, seed, deterministic, whole, block, guard,
    places=False,
):
    """The split's serialized examples, one at a time (see `serialized_blocks`;
    with `places`, each as `(record, shard index, index in the shard)`).

    `whole` is False when each reader sees only part of the split (tf.data
    service workers), so the split's count cannot be asserted.
    """
    dataset = serialized_blocks(
        paths, counts, shuffle_files, seed, deterministic, block, guard, places
    ).unbatch()
    if not whole:
        return dataset
    return with_count(dataset, num_examples)


def with_count(dataset, num_examples):
    # The metadata knows the exact count: Keras then shows epoch progress,
    # and a shard that lost records fails loudly instead of shrinking an epoch.
    return dataset.apply(tf.data.experimental.assert_cardinality(num_examples))
