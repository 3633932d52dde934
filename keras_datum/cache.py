"""What a cache folder holds: its file names, its metadata's schema, the
source fingerprint (where the cache lives, and its life, are `store.py`'s).

A cache folder holds the shards (`<split>-00000-of-00008.tfrecord`), the
report of invalid files (`invalid_files.json`) and `metadata.json`, which is
written last. The folder only ever appears under its final name complete: the
export writes into a temporary sibling and renames it into place.
"""

import hashlib
import json
import os
import re

from keras_datum import sources
from keras_datum import storage

SCHEMA_VERSION = 1
METADATA_FILE = "metadata.json"
REPORT_FILE = "invalid_files.json"
# TFDS's files beside the shards (written by `tfds_metadata`).
FEATURES_FILE = "features.json"
DATASET_INFO_FILE = "dataset_info.json"
# Stored in every example besides the problem's features: the source file,
# relative to the source folder (for reports and `file_paths`).
SOURCE_FEATURES = {"source/filename": {"dtype": "string", "shape": []}}
_SHARD_NAME = re.compile(r"^[a-z]+-\d{5}-of-\d{5}\.tfrecord$")


class CacheError(ValueError):
    """A cache folder whose metadata cannot be trusted; the message names it."""


def fingerprint(layout, root, sizes=None):
    """Hashes the relative path, size and mtime of every file the export reads,
    and the layout's facts (`layout.info`: the class names among them, so an
    empty class folder added or removed, which Keras counts, exports again).

    Args:
        sizes: a dict that, when given, receives each file's size (0 when it
            is missing), so that planning the export need not stat every
            file again.

    Returns:
        A dict with `digest`, `num_files` and `num_bytes`.
    """
    paths = [r.path for records in layout.splits.values() for r in records]
    paths += list(layout.extra_files)
    hasher = hashlib.sha256(json.dumps(layout.info, sort_keys=True, default=str).encode())
    total = 0
    for path in sorted(set(paths)):
        try:
            size, mtime = storage.stat(path)
        except FileNotFoundError:  # An annotation naming a missing image.
            size, mtime = -1, -1
        total += max(size, 0)
        if sizes is not None:
            sizes[path] = max(size, 0)
        rel = sources.relative_path(path, root)
        hasher.update(f"{rel}\t{size}\t{mtime}\n".encode("utf-8", "surrogateescape"))
    return {"digest": hasher.hexdigest(), "num_files": len(paths), "num_bytes": total}


def shard_name(split, index, count):
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def json_text(data):
    """The text `write_json` writes for `data` (a cache's export key hashes
    it: see `store.export_key`)."""
    return json.dumps(data, indent=2, sort_keys=True)


def write_json(path, data):
    storage.write_text(path, json_text(data))


def _require(condition, path, message):
    if not condition:
        raise CacheError(
            f"The cache metadata {path!r} is invalid: {message}. Delete the "
            "cache folder or pass reexport='always' to rebuild it."
        )


def validate_metadata(meta, path):
    """Checks `meta` against the schema; raises `CacheError` naming `path`."""
    _require(isinstance(meta, dict), path, "not a JSON object")
    _require(
        meta.get("schema_version") == SCHEMA_VERSION,
        path,
        f"schema_version {meta.get('schema_version')!r} is not {SCHEMA_VERSION}",
    )
    for key, kind in (
        ("keras_datum_version", str),
        ("problem", str),
        ("layout", str),
        ("class_names", list),
        ("label_spec", dict),
        ("splits", dict),
        ("features", dict),
        ("export_options", dict),
        ("source_fingerprint", dict),
        ("invalid_files", dict),
    ):
        _require(isinstance(meta.get(key), kind), path, f"'{key}' must be a {kind.__name__}")
    _require(
        all(isinstance(c, str) for c in meta["class_names"]),
        path,
        "'class_names' must hold strings",
    )
    _require("train" in meta["splits"], path, "there is no 'train' split")
    _require(isinstance(meta["label_spec"].get("type"), str), path, "'label_spec' has no type")
    num_classes = meta["label_spec"].get("num_classes")
    _require(
        num_classes is None or num_classes == len(meta["class_names"]),
        path,
        f"'class_names' holds {len(meta['class_names'])} names, and 'label_spec' "
        f"says {num_classes!r} classes",
    )
    _require(
        isinstance(meta["invalid_files"].get("count"), int), path, "'invalid_files' has no count"
    )
    for name, feature in meta["features"].items():
        _require(
            isinstance(feature, dict)
            and feature.get("dtype") in ("string", "int64", "float32")
            and (feature.get("shape") is None or isinstance(feature.get("shape"), list)),
            path,
            f"feature {name!r} needs a dtype (string, int64, float32) and a shape (list or null)",
        )
    for split, info in meta["splits"].items():
        _require(isinstance(info, dict), path, f"split {split!r} must be an object")
        shards = info.get("shards")
        count = info.get("num_examples")
        _require(isinstance(count, int) and count >= 0, path, f"split {split!r} has a bad num_examples")
        _require(isinstance(shards, list) and shards, path, f"split {split!r} lists no shards")
        for shard in shards:
            _require(
                isinstance(shard, dict)
                and isinstance(shard.get("file"), str)
                and _SHARD_NAME.match(shard["file"])
                and isinstance(shard.get("num_examples"), int),
                path,
                f"split {split!r} has a malformed shard entry {shard!r}",
            )
        _require(
            sum(s["num_examples"] for s in shards) == count,
            path,
            f"split {split!r}: shard lengths do not add up to {count}",
        )


def read_metadata(cache_dir):
    """Reads and validates `metadata.json`; `None` when there is no cache.

    Raises:
        CacheError: the file exists but is truncated, edited into an invalid
            state or from another schema version.
    """
    path = os.path.join(cache_dir, METADATA_FILE)
    try:
        with storage.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        meta = json.loads(data.decode("utf-8"))
    except ValueError as e:  # Not UTF-8 (UnicodeDecodeError), or not JSON.
        raise CacheError(
            f"The cache metadata {path!r} is not valid JSON ({e}). Delete the "
            "cache folder or pass reexport='always' to rebuild it."
        ) from e
    validate_metadata(meta, path)
    return meta
