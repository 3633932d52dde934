"""Image classification: class folders, split folders and Datum's CSV layout.

Source layouts, tried in this order:

1. Datum's CSV layout: a `<split>/` folder of images and a `<split>.csv` with a
   `filename` column (names without extension; with one is accepted too) and
   label columns.

   ```
   root/
     train/  0001.jpg 0002.png ...
     train.csv          filename,label
     val/    ...        0001,2
     val.csv
   ```

   One label column of integers (or of names) is a class label. One column of
   integer lists (`[0, 3]`) is multi-label: `y` is a multi-hot float32 vector.
   Floats, float lists or several numeric columns are regression targets:
   `y` is a float32 vector. No label column gives unlabelled images.
2. Split folders: `train/`, `val/` or `validation/`, and `test/`, each holding
   class folders.
3. One folder per class, exactly as `keras.utils.image_dataset_from_directory`
   reads it: classes are the sorted non-hidden subfolders, and images are
   found recursively below each.
"""

import csv
import io
import math
import os
import re

import tensorflow as tf

from keras_datum import images
from keras_datum import notices
from keras_datum import sources
from keras_datum import storage
from keras_datum.problems import base
from keras_datum.sources import ExampleRecord
from keras_datum.sources import Layout

NAME = "classification"
SPLIT_FOLDERS = sources.SPLIT_NAMES
LABEL_MODES = ("int", "categorical", "binary", None)
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
# Integer labels are classes 0..K-1, K = the largest + 1, and each gets a
# name. An id column taken for the label (one cell `2000000000`) would build
# two billion names: 2 GB in seconds. 100,000 is 5x the largest class counts
# in use (ImageNet-21k has 21,841); K above it is refused unless the CSV has
# as many rows, the least a dataset of that many classes needs.
MAX_CLASSES = 100_000
# Regression targets are stored as float32; a larger value would become inf.
_FLOAT32_MAX = 3.4028234663852886e38


# --- Finding examples -------------------------------------------------------


def find_layout(root, follow_links=False):
    layout = _find_csv_layout(root, follow_links)
    if layout is not None:
        return layout
    return find_folder_layout(root, follow_links)


def find_folder_layout(
    root, follow_links, formats=sources.IMAGE_FORMATS, problem=NAME, what="images"
):
    """Split folders of class folders, or class folders (shared with text)."""
    subdirs = sources.visible_subdirs(root)
    if subdirs and "train" in subdirs and set(subdirs) <= set(SPLIT_FOLDERS):
        name, class_root = "split_folders", os.path.join(root, "train")
        folders = {
            split: os.path.join(root, f)
            for split, f in sources.split_folders(subdirs, root).items()
        }
    else:
        if not storage.listdir(root):
            raise ValueError(f"The source folder {root!r} is empty.")
        _refuse_split_folders_with_others(root, subdirs)
        _refuse_split_folders_without_train(root, subdirs)
        name, class_root, folders = "class_folders", root, {"train": root}
    class_names = sources.visible_subdirs(class_root)
    if not class_names:
        raise ValueError(
            f"No class folders found in {class_root!r}: put the {what} of "
            "each class in a subfolder named after the class."
        )
    splits = {}
    # With links followed, a file two class or split folders reach (a loop
    # `a/b -> ../b`, `b/a -> ../a`) is listed once, under the first in sorted
    # order: else it would be two examples, perhaps one in train, one in val.
    taken = set()
    for split, folder in folders.items():
        extra = sorted(set(sources.visible_subdirs(folder)) - set(class_names))
        if extra:
            raise ValueError(
                f"{folder!r} has class folders that 'train/' lacks: {extra}."
            )
        splits[split] = _class_folder_records(
            folder, class_names, root, follow_links, formats, taken
        )
        _check_loose_files(folder, formats, what, bool(splits[split]))
    if not splits["train"]:
        raise ValueError(
            f"No {what} found in {class_root!r}. Expected files ending in one "
            f"of {', '.join(formats)} inside one folder per class."
        )
    return Layout(
        name=name, problem=problem, splits=splits, info=class_info(class_names)
    )


def _refuse_split_folders_with_others(root, subdirs):
    """A `train/` beside another split folder holding the same class folders
    is a split-folders source with something else at its top: read as class
    folders, its classes would be the split names. (A class named `train`,
    as in Pascal VOC, holds images, not the other split's class folders.)"""
    splits = [f for f in subdirs if f in SPLIT_FOLDERS]
    if "train" not in splits or len(splits) < 2:
        return
    train_classes = set(sources.visible_subdirs(os.path.join(root, "train")))
    for folder in splits:
        if folder != "train" and train_classes & set(
            sources.visible_subdirs(os.path.join(root, folder))
        ):
            others = sorted(set(subdirs) - set(SPLIT_FOLDERS))
            raise ValueError(
                f"{root!r} looks like split folders ('train/' and "
                f"'{folder}/' hold the same class folders), but it also has "
                f"{others}. A split-folders source holds only 'train/', "
                "'val/' (or 'validation/') and 'test/': move the others out."
            )


def _refuse_split_folders_without_train(root, subdirs):
    """`val/` and `test/` of class folders, and no `train/`: read as class
    folders, the classes would be the split names."""
    if not subdirs or not set(subdirs) <= set(SPLIT_FOLDERS):
        return
    if all(sources.visible_subdirs(os.path.join(root, d)) for d in subdirs):
        raise ValueError(
            f"{root!r} holds only the split folders {subdirs}, each with "
            "subfolders: split folders need a 'train/' (its class folders name "
            "the classes). To use these folders as classes, hold the images "
            "directly in them."
        )


def _check_loose_files(folder, formats, what, has_records):
    """Files beside the class folders have no class: Keras skips them too.

    Raises when they are all the split has (a `val/` of loose images would
    be an empty split), else warns with how many are left out.
    """
    loose = [
        n for n in storage.listdir(folder)
        if not n.startswith(".") and n.lower().endswith(formats)
        and not storage.isdir(os.path.join(folder, n))
    ]
    if not loose:
        return
    message = (
        f"{folder!r} holds {len(loose)} {what} outside the class folders "
        f"(such as {min(loose)!r}); they have no class"
    )
    if not has_records:
        raise ValueError(f"{message}, and the folder has no other {what}. Move them "
                         "into one folder per class.")
    notices.warn(f"{message} and are left out.")


def _class_folder_records(directory, class_names, root, follow_links, formats, taken):
    records = []
    for index, name in enumerate(class_names):
        class_dir = os.path.join(directory, name)
        for path in sources.iter_image_files(class_dir, follow_links, formats, taken):
            records.append(
                ExampleRecord(
                    path=path,
                    relpath=sources.relative_path(path, root),
                    labels={"label": [index]},
                    stratum=index,
                )
            )
    return records


def class_info(class_names):
    return {
        "class_names": list(class_names),
        "label_spec": {"type": "class", "num_classes": len(class_names)},
    }


# --- Datum's CSV layout -----------------------------------------------------


def _find_csv_layout(root, follow_links):
    found = {}
    for folder, split in SPLIT_FOLDERS.items():
        csv_path = os.path.join(root, folder + ".csv")
        if storage.is_any_file(csv_path) and storage.isdir(os.path.join(root, folder)):
            if split in found:
                raise ValueError(
                    f"{root!r} has both 'val.csv' and 'validation.csv'; keep one."
                )
            found[split] = (folder, csv_path)
    if not found:
        return None
    for folder in SPLIT_FOLDERS:
        csv_path = os.path.join(root, folder + ".csv")
        if storage.is_any_file(csv_path) and not storage.isdir(os.path.join(root, folder)):
            raise ValueError(
                f"{csv_path!r} has no {folder + '/'!r} folder beside it: in the CSV "
                "layout each split's images are in the folder named after its CSV."
            )
    if "train" not in found:
        raise ValueError(
            f"{root!r} has CSV splits {sorted(found)} but no 'train.csv' "
            "with a 'train/' folder."
        )
    rows_by_split = {}
    columns = None
    for split, (folder, csv_path) in found.items():
        split_columns, rows = _read_csv(root, folder, csv_path, follow_links)
        if columns is not None and split_columns != columns:
            raise ValueError(
                f"{csv_path!r} has label columns {split_columns}, but the "
                f"other CSV files have {columns}."
            )
        columns = split_columns
        rows_by_split[split] = rows
    sources.refuse_files_in_two_splits(
        {split: [path for path, _, _ in rows] for split, rows in rows_by_split.items()},
        follow_links,
    )
    label_spec, class_names, encode = _infer_labels(columns, rows_by_split)
    splits = {}
    for split, rows in rows_by_split.items():
        splits[split] = []
        for path, cells, _where in rows:
            labels, stratum = encode(cells)
            splits[split].append(
                ExampleRecord(
                    path=path,
                    relpath=sources.relative_path(path, root),
                    labels=labels,
                    stratum=stratum,
                )
            )
    return Layout(
        name="csv",
        problem=NAME,
        splits=splits,
        info={"class_names": class_names, "label_spec": label_spec},
        extra_files=[csv_path for _, csv_path in found.values()],
    )


def _read_csv(root, folder, csv_path, follow_links):
    """Returns (label column names, [(image path, label cells, 'file:line')])."""
    image_dir = os.path.join(root, folder)
    by_stem = {}
    for path in sources.iter_image_files(image_dir, follow_links):
        rel = sources.relative_path(path, image_dir)
        by_stem.setdefault(os.path.splitext(rel)[0], []).append(path)
        by_stem.setdefault(rel, []).append(path)
    reader = csv.reader(io.StringIO(sources.read_text(csv_path), newline=""))
    header = next(reader, None)
    if not header or "filename" not in [h.strip() for h in header]:
        raise ValueError(
            f"{csv_path!r} needs a header row with a 'filename' column. "
            f"Received header: {header}"
        )
    header = [h.strip() for h in header]
    name_index = header.index("filename")
    label_columns = [h for i, h in enumerate(header) if i != name_index]
    rows, missing, listed = [], [], {}
    end = reader.line_num
    for row in reader:
        # A row's first line (a quoted cell may span lines).
        line, end = end + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        where = f"{csv_path}:{line}"
        if len(row) != len(header):
            raise ValueError(
                f"{where}: expected {len(header)} columns, found {len(row)}."
            )
        name = row[name_index].strip()
        sources.resolve_inside(image_dir, name, where)
        matches = by_stem.get(name.replace(os.sep, "/"))
        if not matches:
            missing.append(name)
            continue
        if len(matches) > 1:
            raise ValueError(
                f"{where}: {name!r} matches several files: "
                f"{[os.path.basename(m) for m in matches]}."
            )
        if matches[0] in listed:
            # Twice in one split, a carve could put one copy in val.
            raise ValueError(
                f"{where}: {name!r} is listed again (first at "
                f"{listed[matches[0]]}); list each image once."
            )
        listed[matches[0]] = where
        cells = [c for i, c in enumerate(row) if i != name_index]
        rows.append((matches[0], cells, where))
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise ValueError(
            f"{csv_path!r} names {len(missing)} files missing from "
            f"{image_dir!r}: {shown}{' ...' if len(missing) > 5 else ''}"
        )
    if not rows:
        raise ValueError(f"{csv_path!r} lists no images.")
    return label_columns, rows


def parse_label_cell(text, where):
    """Parses one CSV label cell: an int, a float, a `[list]` of them, or a name.

    Never evaluates the text: numbers are matched explicitly.

    Raises:
        ValueError: a list item that is not a number, an empty cell, or an
            integer too long for Python to read; names `where`.
    """
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        items = [t for t in re.split(r"[,\s;]+", text[1:-1]) if t]
        values = []
        for item in items:
            if not _NUMBER.match(item):
                raise ValueError(f"{where}: {item!r} in {text!r} is not a number.")
            values.append(_number(item, where))
        return values
    if _NUMBER.match(text):
        return _number(text, where)
    if not text:
        raise ValueError(f"{where}: empty label cell.")
    return text


def _number(text, where):
    if not re.fullmatch(r"[+-]?\d+", text):
        return float(text)  # Too large a float is inf, refused where it matters.
    try:
        return int(text)
    except ValueError:  # More digits than Python converts (sys.int_info).
        raise ValueError(
            f"{where}: the integer {_shown(text)} has {len(text)} digits, too many "
            "for a label."
        ) from None


def _shown(value, limit=24):
    """`value` as text, cut to `limit` characters (a label can be 4,000 digits)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_class_labels(labels, num_rows):
    """Checks class indices before the class list (0..K-1) is built.

    Args:
        labels: `(label, where)` pairs, `where` naming the file and line.
        num_rows: how many examples the labels are for.

    Returns:
        K, the number of classes: the largest label + 1 (0 for no labels).

    Raises:
        ValueError: a negative label, or K above both `num_rows` and
            `MAX_CLASSES` (an id column taken for the label); names the
            file, the line and the value.
    """
    largest, largest_where = -1, None
    for label, where in labels:
        if label < 0:
            raise ValueError(f"{where}: class labels must be >= 0. Received: {_shown(label)}")
        if label > largest:
            largest, largest_where = label, where
    if largest + 1 > max(num_rows, MAX_CLASSES):
        raise ValueError(
            f"{largest_where}: the class label {_shown(largest)} would make "
            f"{_shown(largest + 1)} classes (labels are 0..K-1), more than the "
            f"{num_rows} examples and the limit of {MAX_CLASSES}. Is this column "
            f"an id rather than a class label? Received: {_shown(largest)}"
        )
    return largest + 1


def regression_target(value, where):
    """`value` as the float32 a regression target is stored as.

    Raises:
        ValueError: `value` is beyond float32's range (it would be stored
            as inf); names `where` and the value.
    """
    try:
        number = float(value)
    except OverflowError:  # An int of more than 308 digits.
        number = math.inf
    if not abs(number) <= _FLOAT32_MAX:
        raise ValueError(
            f"{where}: the regression target {_shown(value)} does not fit in "
            f"float32 (at most {_FLOAT32_MAX:.4g} in size). Received: {_shown(value)}"
        )
    return number


def _infer_labels(columns, rows_by_split):
    """Chooses the label type from every cell; returns (spec, names, encode)."""
    all_rows = [row for rows in rows_by_split.values() for row in rows]
    if not columns:
        return {"type": "none"}, [], lambda cells: ({}, None)
    wheres = [where for _, _, where in all_rows]
    parsed = [
        [parse_label_cell(cell, where) for cell in cells]
        for _, cells, where in all_rows
    ]
    if len(columns) > 1:
        return _several_columns(columns, parsed, wheres)
    values = [v[0] for v in parsed]
    kinds = {
        "list" if isinstance(v, list) else "str" if isinstance(v, str) else
        "int" if isinstance(v, int) else "float"
        for v in values
    }
    if kinds == {"str"}:
        names = sorted(set(values))
        index = {name: i for i, name in enumerate(names)}
        spec = {"type": "class", "num_classes": len(names), "columns": columns}
        return spec, names, lambda cells: _class_label(index[cells[0].strip()])
    if kinds == {"int"}:
        count = check_class_labels(zip(values, wheres), len(values))
        spec = {"type": "class", "num_classes": count, "columns": columns}
        return spec, [str(i) for i in range(count)], lambda cells: _class_label(
            int(cells[0])
        )
    if kinds <= {"int", "float"}:
        for value, where in zip(values, wheres):
            regression_target(value, where)
        spec = {"type": "regression", "size": 1, "columns": columns}
        return spec, [], lambda cells: ({"label": [float(cells[0])]}, None)
    if kinds == {"list"}:
        return _list_labels(columns, values, wheres)
    raise ValueError(
        f"Column {columns[0]!r} mixes label kinds {sorted(kinds)}; use one of "
        "integers, floats, [lists] or class names throughout."
    )


def _several_columns(columns, parsed, wheres):
    """Several label columns: one regression target, a number per column."""
    for where, values in zip(wheres, parsed):
        for column, value in zip(columns, values):
            if not isinstance(value, (int, float)):
                raise ValueError(
                    f"{where}: column {column!r} must hold a number when "
                    f"there are several label columns. Received: {value!r}"
                )
            regression_target(value, where)
    spec = {"type": "regression", "size": len(columns), "columns": columns}
    return spec, [], lambda cells: (
        {"label": [float(parse_label_cell(c, "")) for c in cells]},
        None,
    )


def _list_labels(columns, values, wheres):
    """`[lists]`: multi-label class indices when all are ints >= 0, else
    regression targets of one length."""
    if all(isinstance(x, int) and x >= 0 for v in values for x in v):
        labels = ((x, where) for v, where in zip(values, wheres) for x in v)
        count = check_class_labels(labels, len(values))
        spec = {"type": "multi_label", "num_classes": count, "columns": columns}
        names = [str(i) for i in range(count)]
        return spec, names, lambda cells: (
            {"label": parse_label_cell(cells[0], "")},
            None,
        )
    sizes = {len(v) for v in values}
    if len(sizes) != 1:
        raise ValueError(
            f"Column {columns[0]!r} holds float lists of different lengths "
            f"{sorted(sizes)}; regression targets need one length."
        )
    for value, where in zip(values, wheres):
        for x in value:
            regression_target(x, where)
    spec = {"type": "regression", "size": sizes.pop(), "columns": columns}
    return spec, [], lambda cells: (
        {"label": [float(x) for x in parse_label_cell(cells[0], "")]},
        None,
    )


def _class_label(index):
    return {"label": [index]}, index


# --- Reading ----------------------------------------------------------------


def refuse_class_label_modes(options, what):
    """For problems whose `y` is not a class: one-hot and binary make no sense."""
    if options.label_mode in ("categorical", "binary"):
        raise ValueError(
            f"`label_mode={options.label_mode!r}` is for classification; "
            f"{what}. Leave label_mode='int'."
        )


def check_read_options(info, options):
    spec = info["label_spec"]
    label_mode = options.label_mode
    if spec["type"] == "class":
        if label_mode == "binary" and spec["num_classes"] != 2:
            raise ValueError(
                'When passing `label_mode="binary"`, there must be exactly 2 '
                f"classes. Received: class_names={info['class_names']}"
            )
    elif spec["type"] == "none":
        # No labels: `x` only, with the default "int" too (as Keras with
        # `labels=None`). A class label mode asks for labels there are not.
        if label_mode in ("categorical", "binary"):
            raise ValueError(
                f"`label_mode={label_mode!r}` needs labels, and this dataset has no "
                "label columns: it yields images only. Use label_mode=None."
            )
    elif label_mode in ("categorical", "binary"):
        raise ValueError(
            f"`label_mode={label_mode!r}` needs class labels, but this "
            f"dataset's labels are {spec['type']} (y is a float32 vector). "
            "Use label_mode='int' (the default) or None."
        )


def features(info):
    """The stored feature spec: the image plus the label."""
    return {**images.IMAGE_FEATURES, **label_features(info)}


def encode(record, options):
    """Validates one image; returns (features to store, stats)."""
    features, stats, _ = images.encode_features(record.path, options.max_image_side)
    features.update(record.labels)
    return features, stats


def label_features(info):
    spec = info["label_spec"]
    if spec["type"] == "class":
        return {"label": {"dtype": "int64", "shape": []}}
    if spec["type"] == "multi_label":
        return {"label": {"dtype": "int64", "shape": None}}
    if spec["type"] == "regression":
        return {"label": {"dtype": "float32", "shape": [spec["size"]]}}
    return {}


def decode(parsed, info, options):
    """Builds the KerasCV dict for one parsed example (graph code)."""
    inputs = {"images": images.decode_and_resize(parsed, options)}
    return with_labels(inputs, parsed, info, options)


def with_labels(inputs, parsed, info, options):
    """Adds `"labels"` in the form `label_mode` asks for (shared with text)."""
    spec = info["label_spec"]
    label_mode = options.label_mode
    if label_mode is None or spec["type"] == "none":
        return inputs
    label = parsed["label"]
    if spec["type"] == "class":
        if label_mode == "categorical":
            label = tf.one_hot(label, spec["num_classes"], dtype=tf.float32)
        elif label_mode == "binary":
            label = tf.reshape(tf.cast(label, tf.float32), [1])
        else:
            label = tf.cast(label, tf.int32)
    elif spec["type"] == "multi_label":
        hot = tf.one_hot(label, spec["num_classes"], dtype=tf.float32)
        label = tf.minimum(tf.reduce_sum(hot, axis=0), 1.0)
        label = tf.reshape(label, [spec["num_classes"]])
    inputs["labels"] = label
    return inputs


def to_keras(inputs):
    if "labels" in inputs:
        return inputs["images"], inputs["labels"]
    return inputs["images"]


class Classification(base.Problem):
    """The classification problem's hooks: this module's functions."""

    NAME = NAME
    OPTIONS = base.IMAGE_OPTIONS
    find_layout = staticmethod(find_layout)
    features = staticmethod(features)
    encode = staticmethod(encode)
    decode = staticmethod(decode)
    to_keras = staticmethod(to_keras)
    check_read_options = staticmethod(check_read_options)


PROBLEM = Classification()
