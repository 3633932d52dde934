"""Exports of the original OpenAGI `datum` package, read in place.

`datum` (github.com/openAGI/datum) writes one folder per dataset:

```
export/
  train-00000-of-00002.tfrecord ...     tf.train.Example shards: `<split>-%05d-of-%05d`
  val-00000-of-00001.tfrecord
  shard_info.json                       {split: {shard file: example count}}
  datum_to_type_and_shape_mapping.json  {feature: {"type": "int" | "float" | "string",
                                                   "shape": [...], "dense": bool}}
```

Every example holds the source image file's bytes, as they were on disk
(JPEG or PNG), under `image`, next to what datum's generator produced:

- image classification: one feature per label column of datum's CSV
  (`label`, ...), each an int or a float, or a list of them;
- Pascal VOC detection: `xmin`, `xmax`, `ymin`, `ymax` (float lists, relative
  to the image size written in the XML), `labels` (int list numbered from 1:
  line n of datum's `classes.names` is label n), and `pose`, `is_truncated`,
  `labels_difficult`, which are not read here.

The mapping file is written from the last example datum wrote, so its shapes
(and the image shape) hold for that example only: every numeric feature is
parsed as a variable-length list, and only the kind of a feature (int, float,
string) is taken from the mapping.

This module turns the two JSON files into the metadata dict the rest of
keras_datum reads (`read_metadata`), and one serialized datum example into the
features the problem's `decode` expects (`parse_example`). Nothing is written
into the folder; what has to be counted (the classes) is kept in memory.
"""

import datetime
import hashlib
import math
import os

import tensorflow as tf

from keras_datum import cache
from keras_datum import sources
from keras_datum import storage
from keras_datum.problems import classification
from keras_datum.problems import detection
from keras_datum.problems import labels
from keras_datum.version import __version__

SHARD_INFO_FILE = "shard_info.json"
MAPPING_FILE = "datum_to_type_and_shape_mapping.json"
# The metadata key that marks a datum export; the pipeline parses with
# `parse_example` when it is there.
META_KEY = "datum_export"
LAYOUT = "datum"
IMAGE = "image"
BOX_COLUMNS = ("xmin", "ymin", "xmax", "ymax")
DETECTION_LABELS = "labels"
# datum's `class_map` numbers the lines of `classes.names` from 1.
FIRST_DETECTION_LABEL = 1
_DTYPES = {"int": "int64", "float": "float32"}
_TF_DTYPES = {"int64": tf.int64, "float32": tf.float32}
# Serialized examples parsed at a time when counting classes.
SCAN_BATCH = 256
# Class counts already taken in this process, by export fingerprint and column.
_SCANNED: dict[tuple, object] = {}
# Counts and shapes are int64 in TensorFlow; a larger number in a JSON file
# fits no tensor.
_COUNT_LIMIT = 2**63


def is_export(folder):
    """True when `folder` holds datum's `shard_info.json` and type mapping."""
    return all(
        storage.isfile(os.path.join(folder, name)) for name in (SHARD_INFO_FILE, MAPPING_FILE)
    )


def check_export(folder, problem=None):
    """Checks all that can be checked without reading a shard.

    Returns:
        `(splits, mapping, layout)`: see `read_splits`, `read_mapping` and
        `_layout`.

    Raises:
        FileNotFoundError: the folder, one of its JSON files or a shard is
            missing; the message names it.
        ValueError: a JSON file is malformed, or the features are not a
            layout keras_datum reads; the message names the file.
    """
    if not storage.isdir(folder):
        raise FileNotFoundError(f"datum export folder not found: {folder!r}")
    for name in (SHARD_INFO_FILE, MAPPING_FILE):
        path = os.path.join(folder, name)
        if not storage.isfile(path):
            raise FileNotFoundError(
                f"{folder!r} is not a datum export: {path!r} does not exist. A datum "
                f"export holds {SHARD_INFO_FILE}, {MAPPING_FILE} and the .tfrecord shards."
            )
    splits = read_splits(folder)
    mapping = read_mapping(folder)
    return splits, mapping, _layout(folder, mapping, problem)


# --- The two JSON files -------------------------------------------------------


def _read_json(path, expected):
    data = sources.read_json_object(path, expected)
    if not data:
        raise ValueError(f"{path}: expected {expected}. Received: {data!r:.200}")
    return data


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT


def read_splits(folder):
    """`shard_info.json` as keras_datum's split metadata; every shard must exist.

    Returns:
        `{split: {"num_examples": n, "shards": [{"file": name, "num_examples": n}]}}`,
        with datum's `validation` split named `val`.

    Raises:
        ValueError: the file is not `{split: {shard file: example count}}`.
        FileNotFoundError: a shard it lists is missing; names both.
    """
    path = os.path.join(folder, SHARD_INFO_FILE)
    shard_info = _read_json(path, "an object {split: {shard file: example count}}")
    splits = {}
    for name, shards in shard_info.items():
        if not isinstance(shards, dict) or not all(
            isinstance(f, str) and _is_count(n) for f, n in shards.items()
        ):
            raise ValueError(
                f"{path}: split {name!r} must map shard file names to example "
                f"counts. Received: {shards!r:.200}"
            )
        split = sources.SPLIT_NAMES.get(name, name)
        if split in splits:
            raise ValueError(f"{path}: lists both 'val' and 'validation'; keep one.")
        entries = []
        for file, count in shards.items():
            # datum writes plain file names next to the JSON files.
            if os.path.isabs(file) or os.path.normpath(file).startswith(os.pardir):
                raise ValueError(f"{path}: shard {file!r} is not inside {folder!r}.")
            shard_path = os.path.join(folder, file)
            if not storage.isfile(shard_path):
                raise FileNotFoundError(
                    f"{path} lists the shard {file!r}, but {shard_path!r} does not exist."
                )
            entries.append({"file": file, "num_examples": count})
        splits[split] = {
            "num_examples": sum(e["num_examples"] for e in entries),
            "shards": entries,
        }
    # datum lists the split written last first.
    order = ["train", "val", "test"]
    return dict(sorted(splits.items(), key=lambda s: (order + [s[0]]).index(s[0])))


def read_mapping(folder):
    """`datum_to_type_and_shape_mapping.json`: `{feature: {"type", "shape", "dense"}}`.

    Raises:
        ValueError: malformed JSON, or an entry without a known type and a
            shape list of sizes (integers >= 0 that fit int64); names the
            file and the feature.
    """
    path = os.path.join(folder, MAPPING_FILE)
    mapping = _read_json(path, "an object {feature: {type, shape, dense}}")
    for name, entry in mapping.items():
        if (
            not isinstance(entry, dict)
            or entry.get("type") not in ("int", "float", "string")
            or not isinstance(entry.get("shape"), list)
            or not all(_is_count(size) for size in entry["shape"])
            or not _is_count(math.prod(entry["shape"]))
        ):
            raise ValueError(
                f"{path}: feature {name!r} needs a type ('int', 'float' or "
                "'string') and a shape list of sizes (integers >= 0, below "
                f"2**63 in all). Received: {entry!r:.200}"
            )
    return mapping


# --- Which problem the features describe ---------------------------------------


def _layout(folder, mapping, problem):
    """(problem, label kind, numeric features to parse {name: dtype}, label columns).

    Raises:
        ValueError: a feature layout that is neither datum's image
            classification nor its VOC detection; names the mapping file.
    """
    path = os.path.join(folder, MAPPING_FILE)
    if problem not in (None, classification.NAME, detection.NAME):
        raise ValueError(
            f"Reading datum exports supports problem='classification' and "
            f"problem='detection' (or None to detect it). Received: problem={problem!r}"
        )
    if mapping.get(IMAGE, {}).get("type") != "string":
        raise ValueError(
            f"{path}: unknown feature layout {sorted(mapping)}: keras_datum reads "
            f"datum's image classification and VOC detection exports, which "
            f"store the image bytes in a string feature {IMAGE!r}."
        )
    box_features = BOX_COLUMNS + (DETECTION_LABELS,)
    is_detection = all(name in mapping for name in box_features)
    if problem == detection.NAME or (problem is None and is_detection):
        missing = [name for name in box_features if name not in mapping]
        wrong = [name for name in box_features if mapping.get(name, {}).get("type") == "string"]
        if missing or wrong:
            raise ValueError(
                f"{path}: not a datum VOC detection export: it needs the numeric "
                f"features {list(box_features)}; missing {missing}, strings {wrong}."
            )
        numeric = {name: "float32" for name in BOX_COLUMNS}
        numeric[DETECTION_LABELS] = "int64"
        return detection.NAME, "detection", numeric, []
    # Features datum adds for its sparse features of rank >= 2.
    companions = {name + "_shape" for name in mapping}
    columns = [n for n in mapping if n != IMAGE and n not in companions]
    strings = [n for n in columns if mapping[n]["type"] == "string"]
    if strings:
        raise ValueError(
            f"{path}: unknown feature layout: string features {strings} next to "
            f"{IMAGE!r}. keras_datum reads datum's image classification exports "
            "(numeric label columns) and VOC detection exports (xmin, xmax, ymin, "
            "ymax, labels); segmentation and text exports are not supported."
        )
    numeric = {n: _DTYPES[mapping[n]["type"]] for n in columns}
    if not columns:
        kind = "none"
    elif len(columns) == 1 and mapping[columns[0]]["type"] == "int":
        kind = "class" if not mapping[columns[0]]["shape"] else "multi_label"
    else:
        kind = "regression"
    return classification.NAME, kind, numeric, columns


def _regression_size(mapping, columns):
    # Regression targets have one length in every example; the recorded shape
    # gives it, and each example is checked against it when read.
    return sum(math.prod(mapping[c]["shape"]) for c in columns)


# --- Counting classes ----------------------------------------------------------


def fingerprint(folder, splits):
    """Names, sizes and modification times of the JSON files and shards (no reading)."""
    hasher = hashlib.sha256()
    files = [SHARD_INFO_FILE, MAPPING_FILE]
    files += sorted({s["file"] for info in splits.values() for s in info["shards"]})
    total = 0
    for name in files:
        size, mtime = storage.stat(os.path.join(folder, name))
        total += size
        hasher.update(f"{name}\t{size}\t{mtime}\n".encode("utf-8", "surrogateescape"))
    return {"digest": hasher.hexdigest(), "num_files": len(files), "num_bytes": total}


def scan_labels(folder, splits, column, dtype):
    """Reads one numeric feature of every example: its range and list lengths.

    Returns:
        `{"min": ..., "max": ..., "min_count": ..., "max_count": ...,
        "min_file": ..., "max_file": ...}` (min and max are None when the
        feature holds no values at all; the files are the shards holding
        them).
    """
    files = sorted(
        {s["file"] for info in splits.values() for s in info["shards"] if s["num_examples"]}
    )
    spec = {column: tf.io.VarLenFeature(_TF_DTYPES[dtype])}

    def batches(path):
        def parse(serialized):
            values = tf.io.parse_example(serialized, spec)[column]
            counts = tf.math.bincount(
                tf.cast(values.indices[:, 0], tf.int32),
                minlength=tf.shape(serialized)[0],
                maxlength=tf.shape(serialized)[0],
            )
            return path, values.values, counts

        return tf.data.TFRecordDataset(path).batch(SCAN_BATCH).map(parse)

    dataset = tf.data.Dataset.from_tensor_slices([os.path.join(folder, f) for f in files])
    dataset = dataset.interleave(
        batches,
        cycle_length=max(1, min(len(files), 8)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    out = {"min": None, "max": None, "min_count": None, "max_count": 0, "min_file": None,
           "max_file": None}
    for path, values, counts in dataset.as_numpy_iterator():
        if counts.size:
            low = int(counts.min())
            out["min_count"] = low if out["min_count"] is None else min(out["min_count"], low)
            out["max_count"] = max(out["max_count"], int(counts.max()))
        if values.size:
            low, high = values.min().item(), values.max().item()
            if out["min"] is None or low < out["min"]:
                out["min"], out["min_file"] = low, path.decode()
            if out["max"] is None or high > out["max"]:
                out["max"], out["max_file"] = high, path.decode()
    return out


def _scanned(folder, splits, digest, column, dtype, verbose):
    key = (folder, digest, column)
    if key not in _SCANNED:
        if verbose:
            total = sum(info["num_examples"] for info in splits.values())
            print(
                f"Counting the classes of the datum export {folder} ({total} "
                f"examples, once per process; pass class_names= to skip)."
            )
        _SCANNED[key] = scan_labels(folder, splits, column, dtype)
    return _SCANNED[key]


def _class_names(folder, splits, digest, kind, column, dtype, class_names, verbose):
    """The class names and the (possibly corrected) label kind.

    Given `class_names` are used as they are; else a class-names file in the
    folder (`classes.names`, `labels.txt`, `classes.txt`); else the labels
    are read once and numbered.
    """
    if class_names is not None:
        return list(class_names), kind
    names, _ = sources.read_class_names(folder)
    if names is not None:
        return names, kind
    found = _scanned(folder, splits, digest, column, dtype, verbose)
    low, high = found["min"], found["max"]
    if kind == "detection":
        if low is not None and low < FIRST_DETECTION_LABEL:
            raise ValueError(
                f"{found['min_file']}: holds the detection label {low}, but datum "
                f"numbers classes from {FIRST_DETECTION_LABEL} (line n of classes.names "
                "is label n). Pass class_names= to read it anyway."
            )
        count = _class_count(found, splits, column, high, high)
        return [str(i) for i in range(FIRST_DETECTION_LABEL, count + 1)], kind
    if low is not None and low < 0:
        raise ValueError(
            f"{found['min_file']}: the label column {column!r} holds {low}; class "
            "labels must be >= 0."
        )
    if kind == "class" and found["max_count"] > 1:
        # The mapping's scalar was only the last example's: some hold lists.
        kind = "multi_label"
    count = _class_count(found, splits, column, high, high + 1 if high is not None else 0)
    return [str(i) for i in range(count)], kind


def _class_count(found, splits, column, high, count):
    """`count` classes, checked before their names are built.

    Raises:
        ValueError: `count` is above both the number of examples and
            `labels.MAX_CLASSES` (an id taken for a label); names
            the shard holding the largest label.
    """
    if high is None:
        return 0
    examples = sum(info["num_examples"] for info in splits.values())
    if count > max(examples, labels.MAX_CLASSES):
        raise ValueError(
            f"{found['max_file']}: the label column {column!r} holds {high}, which "
            f"would make {count} classes, more than the {examples} examples and "
            f"the limit of {labels.MAX_CLASSES}: is it an id rather than "
            f"a class label? Received: {high}"
        )
    return int(count)


# --- The metadata ------------------------------------------------------------


def read_metadata(folder, problem=None, class_names=None, verbose=False):
    """The metadata dict of a datum export, as an export's `metadata.json` reads.

    Everything that can be wrong with the folder (malformed JSON, a missing
    shard, an unknown feature layout) is checked before any shard is read.
    Then, unless `class_names` are given or the folder holds a class-names
    file, the labels are read once to count the classes.

    Args:
        folder: the datum export folder.
        problem: `"classification"`, `"detection"` or `None` to tell from
            the features.
        class_names: names of the classes, in label order (for detection,
            the lines of datum's `classes.names`: label 1 is the first).
        verbose: say when the classes are counted.

    Returns:
        A metadata dict with the keys `cache.validate_metadata` checks, and
        `META_KEY`, which holds how to parse the examples.

    Raises:
        FileNotFoundError: a file is missing; the message names it.
        ValueError: a file is malformed or describes an unsupported layout.
    """
    folder = storage.abspath(folder)
    splits, mapping, (problem, kind, numeric, columns) = check_export(folder, problem)
    digest = fingerprint(folder, splits)
    if kind in ("class", "multi_label", "detection"):
        column = DETECTION_LABELS if kind == "detection" else columns[0]
        class_names, kind = _class_names(
            folder, splits, digest["digest"], kind, column, numeric[column],
            class_names, verbose,
        )
    else:
        class_names = []
    if kind == "detection":
        label_spec = {"type": "detection", "num_classes": len(class_names)}
    elif kind == "regression":
        label_spec = {
            "type": "regression", "size": _regression_size(mapping, columns), "columns": columns,
        }
    elif kind == "none":
        label_spec = {"type": "none"}
    else:
        label_spec = {"type": kind, "num_classes": len(class_names), "columns": columns}
    info = {"class_names": class_names, "label_spec": label_spec}
    module = detection if problem == detection.NAME else classification
    created = storage.stat(os.path.join(folder, SHARD_INFO_FILE))[1] / 1e9
    return {
        "schema_version": cache.SCHEMA_VERSION,
        "keras_datum_version": __version__,
        "created": datetime.datetime.fromtimestamp(created, datetime.timezone.utc).isoformat(),
        "source": folder,
        "problem": problem,
        "layout": LAYOUT,
        **info,
        "splits": splits,
        # What `parse_example` hands to the problem's `decode`.
        "features": module.features(info),
        "export_options": {},
        "source_fingerprint": digest,
        "invalid_files": {"count": 0, "report": None},
        META_KEY: {"numeric": numeric, "label_columns": columns},
    }


# --- Reading one example -------------------------------------------------------


def _image_features(data):
    """keras_datum's image features for raw file bytes.

    The JPEG header gives the size that lets `images.decode` decode a big
    JPEG at half size; other formats report 0, which never asks for that.
    """
    is_jpeg = tf.equal(tf.strings.substr(data, 0, 3), b"\xff\xd8\xff")
    size = tf.cond(
        is_jpeg,
        lambda: tf.cast(tf.io.extract_jpeg_shape(data)[:2], tf.int64),
        lambda: tf.zeros([2], tf.int64),
    )
    return {
        "image": data,
        "image/format": tf.where(is_jpeg, "jpeg", "other"),
        "image/height": size[0],
        "image/width": size[1],
    }


def _boxes(values, num_classes):
    """datum's corner lists as keras_datum's clipped, flat `rel_xyxy` boxes.

    Boxes are clipped to the image and boxes without area dropped, as the
    export does for VOC sources; classes are renumbered from 0.
    """
    corners = [values[name] for name in BOX_COLUMNS]
    labels = values[DETECTION_LABELS]
    checks = [
        tf.debugging.assert_equal(
            tf.size(c), tf.size(labels),
            message=f"A datum example holds another number of {name} values than labels",
        )
        for name, c in zip(BOX_COLUMNS, corners)
    ]
    with tf.control_dependencies(checks):
        raw = tf.stack(corners, axis=-1)
    boxes = tf.clip_by_value(raw, 0.0, 1.0)
    keep = (
        tf.reduce_all(tf.math.is_finite(raw), axis=-1)
        & (boxes[:, 2] > boxes[:, 0])
        & (boxes[:, 3] > boxes[:, 1])
    )
    classes = _checked_classes(
        tf.boolean_mask(labels, keep) - FIRST_DETECTION_LABEL, num_classes,
        f"the {DETECTION_LABELS!r} column (datum numbers classes from {FIRST_DETECTION_LABEL})",
    )
    return {
        "objects/boxes": tf.reshape(tf.boolean_mask(boxes, keep), [-1]),
        "objects/classes": classes,
    }


def _checked_classes(labels, num_classes, where):
    """`labels`, asserted to be class indices below `num_classes`.

    The class names given (`class_names=` or a class-names file) can list
    fewer classes than the labels use; an out-of-range label would become an
    all-zero one-hot row or an index past the model's outputs.
    """
    check = tf.debugging.assert_less(
        tf.cast(labels, tf.int64), tf.constant(num_classes, tf.int64),
        message=(
            f"A datum example's class label in {where} is not below the number "
            f"of class names ({num_classes}). Pass class_names= listing every class"
        ),
    )
    low = tf.debugging.assert_non_negative(
        labels, message=f"A datum example's class label in {where} is negative"
    )
    with tf.control_dependencies([check, low]):
        return tf.identity(labels)


def _label(values, meta):
    spec = meta["label_spec"]
    columns = meta[META_KEY]["label_columns"]
    if spec["type"] in ("class", "multi_label"):
        where = f"the column {columns[0]!r}"
        label = _checked_classes(values[columns[0]], spec["num_classes"], where)
        if spec["type"] == "multi_label":
            return {"label": label}
        check = tf.debugging.assert_equal(
            tf.size(label), 1,
            message=f"A datum example holds a list in the class label column {columns[0]!r}",
        )
        with tf.control_dependencies([check]):
            return {"label": tf.reshape(label, [])}
    if spec["type"] == "regression":
        target = tf.concat([tf.cast(values[c], tf.float32) for c in columns], axis=0)
        check = tf.debugging.assert_equal(
            tf.size(target), spec["size"],
            message=f"A datum example's regression columns {columns} hold another number of values",
        )
        with tf.control_dependencies([check]):
            return {"label": tf.reshape(target, [spec["size"]])}
    return {}


def parse_example(serialized, meta):
    """One serialized datum example -> the features the problem's `decode` reads."""
    numeric = meta[META_KEY]["numeric"]
    spec = {IMAGE: tf.io.FixedLenFeature([], tf.string)}
    spec.update({name: tf.io.VarLenFeature(_TF_DTYPES[dtype]) for name, dtype in numeric.items()})
    parsed = tf.io.parse_single_example(serialized, spec)
    values = {name: tf.sparse.to_dense(parsed[name]) for name in numeric}
    features = _image_features(parsed[IMAGE])
    if meta["problem"] == detection.NAME:
        features.update(_boxes(values, meta["label_spec"]["num_classes"]))
    else:
        features.update(_label(values, meta))
    return features
