"""Checking a written cache: record CRCs, counts against the metadata, the metadata itself."""

import os

import tensorflow as tf

from keras_datum import cache
from keras_datum import datum_format
from keras_datum import decodable
from keras_datum import storage


def count_records(path):
    """Reads every record of a shard, checking each CRC.

    Returns:
        `(records read, error message or None)`.
    """
    count = 0
    try:
        for _ in tf.data.TFRecordDataset(path):
            count += 1
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
        return count, decodable.bare_message(e.message)
    return count, None


def verify_cache(cache_dir):
    """Every problem found in `cache_dir`, each naming the file; empty when sound.

    Checks that the metadata is valid, that every shard it lists exists, that
    every record's CRC is intact, and that each shard holds as many records
    as the metadata says. `cache_dir` may also be a folder written by the
    original `datum` package (its `shard_info.json` is the metadata).
    """
    if datum_format.is_export(cache_dir):
        try:
            splits = datum_format.read_splits(cache_dir)
        except (OSError, ValueError) as e:  # A missing shard, malformed JSON.
            return [str(e)]
    else:
        try:
            meta = cache.read_metadata(cache_dir)
        except cache.CacheError as e:
            return [str(e)]
        if meta is None:
            return [f"{cache_dir!r} holds no keras_datum cache (no {cache.METADATA_FILE})."]
        splits = meta["splits"]
    problems = []
    for info in splits.values():
        for shard in info["shards"]:
            path = os.path.join(cache_dir, shard["file"])
            if not storage.isfile(path):
                problems.append(f"{path}: shard listed in the metadata is missing.")
                continue
            count, error = count_records(path)
            if error:
                problems.append(
                    f"{path}: damaged after {count} of {shard['num_examples']} "
                    f"records ({error})."
                )
            elif count != shard["num_examples"]:
                problems.append(
                    f"{path}: holds {count} records, the metadata says "
                    f"{shard['num_examples']}."
                )
    return problems
