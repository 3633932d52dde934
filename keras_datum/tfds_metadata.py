"""TensorFlow Datasets metadata beside the shards, so TFDS can read a cache.

`tfds.builder_from_directory(cache_dir)` needs three kinds of files in the
folder: `dataset_info.json` (the splits, their shard lengths and where the
shards are), `features.json` (how to parse and decode an example) and one
`<feature>.labels.txt` per class-label feature. They are written here as plain
JSON, in the form TFDS 4.x writes them itself (`tfds.folder_dataset.
write_metadata`), so tensorflow-datasets is not a dependency of keras_datum.

The shards keep their names: each split's `filepathTemplate`,
`{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}`, is what TFDS expands to
`train-00000-of-00008.tfrecord`. Every stored feature keeps its key, `/`
included (`source/filename`, `objects/boxes`): TFDS accepts flat keys with `/`
and parses them as they are, so `builder.as_dataset()` yields a flat dict.
A split without examples is not listed (TFDS cannot read an empty split).

How keras_datum's feature spec becomes TFDS features:

- `image`: an encoded `Image` of shape `(None, None, 3)`. Stored images are
  JPEG (grayscale or RGB) or PNG (grayscale, grayscale + alpha, palette, RGB,
  RGBA); decoding every one to 3 channels gives exactly the pixels of
  keras_datum's default `color_mode="rgb"` (alpha dropped, gray repeated).
- `mask` (segmentation): an encoded `Image` of shape `(None, None, 1)`, the
  class index of each pixel.
- class indices (`label` of a class or multi-label dataset, `objects/classes`):
  a `ClassLabel` with the class names (a `Sequence` of them when an example
  holds several).
- `objects/boxes`: a float32 `Tensor` of shape `(None, 4)`, relative `xyxy`
  (keras_datum stores the boxes flat; TFDS regroups them in fours).
- other strings (`text`, `image/format`, `source/filename`): `Text`.
- other numbers: a `Tensor` of the stored dtype; variable-length lists get
  shape `(None,)`.
"""

import os
import re

from keras_datum import cache
from keras_datum import storage

DATASET_INFO_FILE = cache.DATASET_INFO_FILE
FEATURES_FILE = cache.FEATURES_FILE
# TFDS expands `{SPLIT}` and `{SHARD_X_OF_Y}` (`00000-of-00008`) and
# `{FILEFORMAT}` (`tfrecord`): exactly `cache.shard_name`.
FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"
# keras_datum does not version a dataset's content; TFDS requires a version.
VERSION = "1.0.0"
# Encoded image features, and the channels TFDS decodes them to.
IMAGE_CHANNELS = {"image": 3, "mask": 1}
# Features that hold class indices, given a dataset with class names.
CLASS_INDEX_FEATURES = ("label", "objects/classes")
# Features whose flat values TFDS regroups into rows of this shape.
ROW_SHAPES = {"objects/boxes": [4]}

_TFDS = "tensorflow_datasets.core.features."
_CLASSES = {
    "dict": _TFDS + "features_dict.FeaturesDict",
    "image": _TFDS + "image_feature.Image",
    "class_label": _TFDS + "class_label_feature.ClassLabel",
    "sequence": _TFDS + "sequence_feature.Sequence",
    "tensor": _TFDS + "tensor_feature.Tensor",
    "text": _TFDS + "text_feature.Text",
}


def write_tfds_metadata(folder, meta):
    """Writes the TFDS metadata of the cache being written in `folder`.

    Call it after the shards are written (the split sizes are read from
    them) and before `metadata.json`, which must stay the last file written.

    Args:
        folder: the folder that holds the shards.
        meta: the keras_datum metadata of the export (`metadata.json`'s
            content): its `splits`, `features`, `class_names`, `label_spec`,
            `problem`, `layout`, `source` and `keras_datum_version`.

    Returns:
        The names of the files written, relative to `folder`.
    """
    features, label_files = tfds_features(meta)
    written = []
    for feature_name, names in label_files.items():
        name = feature_name.replace("/", ".") + ".labels.txt"
        _write_text(os.path.join(folder, name), "".join(n + "\n" for n in names))
        written.append(name)
    cache.write_json(os.path.join(folder, FEATURES_FILE), features)
    cache.write_json(os.path.join(folder, DATASET_INFO_FILE), dataset_info(folder, meta))
    return written + [FEATURES_FILE, DATASET_INFO_FILE]


def dataset_info(folder, meta):
    """`dataset_info.json`: name, version, splits and shard lengths.

    A split without examples (every file of it invalid) is left out: TFDS
    refuses to read one ("corresponds to no data").
    """
    splits = []
    for split, info in meta["splits"].items():
        if info["num_examples"] == 0:
            continue
        sizes = [storage.getsize(os.path.join(folder, s["file"])) for s in info["shards"]]
        splits.append({
            "name": split,
            "filepathTemplate": FILEPATH_TEMPLATE,
            # int64 fields are strings in the proto's JSON form.
            "shardLengths": [str(s["num_examples"]) for s in info["shards"]],
            "numBytes": str(sum(sizes)),
        })
    info = {
        "name": dataset_name(meta["source"]),
        "version": VERSION,
        "fileFormat": "tfrecord",
        "description": (
            f"Exported by keras_datum {meta['keras_datum_version']} from "
            f"{meta['source']} ({meta['problem']}, {meta['layout']} layout). "
            "keras_datum's own metadata is in metadata.json."
        ),
        "splits": splits,
    }
    keys = supervised_keys(meta["features"])
    if keys:
        info["supervisedKeys"] = {"tuple": {"items": [{"featureKey": k} for k in keys]}}
    return info


def dataset_name(source):
    """The source folder's name in snake_case, as TFDS names datasets."""
    name = re.sub(r"[^a-z0-9]+", "_", os.path.basename(source.rstrip(os.sep)).lower())
    name = name.strip("_")
    if not name or not name[0].isalpha():
        name = "keras_datum_" + name if name else "keras_datum"
    return name


def supervised_keys(features):
    """`(input, target)` for `as_supervised=True`, or `None` (detection)."""
    inputs = "text" if "text" in features else "image"
    if "label" in features:
        return (inputs, "label")
    if "mask" in features:
        return ("image", "mask")
    return None


def tfds_features(meta):
    """`features.json`'s content, and the class names of each class feature.

    Returns:
        `(features, label_files)`: the `FeaturesDict` JSON and
        `{feature name: class names}` for the `.labels.txt` files.
    """
    class_names = meta["class_names"]
    has_classes = bool(class_names) and meta["label_spec"]["type"] in (
        "class", "multi_label", "detection"
    )
    # TFDS reads the names back one per line (any line break, \r too),
    # stripped; names that would not survive that are left out (the features
    # still carry the class count).
    names_survive = all(n and n == n.strip() and n.splitlines() == [n] for n in class_names)
    features, label_files = {}, {}
    for key, spec in meta["features"].items():
        if key in IMAGE_CHANNELS and spec["dtype"] == "string":
            features[key] = _image(IMAGE_CHANNELS[key])
        elif key in CLASS_INDEX_FEATURES and has_classes and spec["dtype"] == "int64":
            features[key] = _class_label(len(class_names))
            if spec["shape"] != []:  # Several classes per example.
                features[key] = _sequence(features[key])
            if names_survive:
                label_files[key] = class_names
        elif spec["dtype"] == "string" and spec["shape"] == []:
            features[key] = {"pythonClassName": _CLASSES["text"], "text": {}}
        else:
            shape = [None] + ROW_SHAPES.get(key, []) if spec["shape"] is None else spec["shape"]
            features[key] = _tensor(spec["dtype"], shape)
    return _features_dict(features), label_files


def _features_dict(features):
    return {"pythonClassName": _CLASSES["dict"], "featuresDict": {"features": features}}


def _shape(dimensions):
    # A scalar's shape is `{}`; unknown dimensions are -1, as strings (int64).
    if not dimensions:
        return {}
    return {"dimensions": [str(-1 if d is None else d) for d in dimensions]}


def _image(channels):
    return {
        "pythonClassName": _CLASSES["image"],
        "image": {"dtype": "uint8", "shape": _shape([None, None, channels])},
    }


def _class_label(num_classes):
    return {
        "pythonClassName": _CLASSES["class_label"],
        "classLabel": {"numClasses": str(num_classes)},
    }


def _sequence(feature):
    return {
        "pythonClassName": _CLASSES["sequence"],
        "sequence": {"feature": feature, "length": "-1"},
    }


def _tensor(dtype, shape):
    return {
        "pythonClassName": _CLASSES["tensor"],
        "tensor": {"dtype": dtype, "encoding": "none", "shape": _shape(shape)},
    }


def _write_text(path, text):
    storage.write_text(path, text)
