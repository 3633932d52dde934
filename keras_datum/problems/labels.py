"""Labels shared by the problems: parsed, checked, stored and handed out.

A label cell (a CSV cell, a datum JSON value) is parsed without evaluating it
(`parse_label_cell`); class indices and regression targets are checked before
anything is built from them (`check_class_labels`, `regression_target`); and a
column of label cells gives its label spec (`infer_labels`):

- `{"type": "class", "num_classes": K}`: class indices 0..K-1 (integers, or
  names, sorted);
- `{"type": "multi_label", "num_classes": K}`: lists of class indices;
- `{"type": "regression", "size": N}`: N floats (float32 when stored);
- `{"type": "none"}`: no labels.

The spec decides the stored label feature (`label_features`) and `y`, in the
form `label_mode` asks for (`with_labels`, checked by `check_label_mode`).
Classification and text use all of it; detection and segmentation, whose `y`
is not a class, only refuse the class label modes (`refuse_class_label_modes`).
"""

import math
import re

import tensorflow as tf

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


# --- Parsing and checking ---------------------------------------------------


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


# --- The label type ---------------------------------------------------------


def class_info(class_names):
    """The info of a class-index layout: its class names and label spec."""
    return {
        "class_names": list(class_names),
        "label_spec": {"type": "class", "num_classes": len(class_names)},
    }


def infer_labels(columns, rows_by_split):
    """Chooses the label type from every cell; returns (spec, names, encode).

    Args:
        columns: the label column names.
        rows_by_split: `{split: [(path, label cells, 'file:line')]}`.

    Returns:
        The label spec, the class names, and `encode`, which turns one row's
        label cells into `(labels, stratum)` for its `ExampleRecord`.
    """
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


# --- Stored features and y --------------------------------------------------


def refuse_class_label_modes(options, what):
    """For problems whose `y` is not a class: one-hot and binary make no sense."""
    if options.label_mode in ("categorical", "binary"):
        raise ValueError(
            f"`label_mode={options.label_mode!r}` is for classification; "
            f"{what}. Leave label_mode='int'."
        )


def check_label_mode(info, options):
    """Refuses a `label_mode` the labels cannot be handed out in (the read
    check of classification and text).

    Raises:
        ValueError: `"binary"` for other than 2 classes, or `"categorical"`
            or `"binary"` for labels that are not classes.
    """
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


def label_features(info):
    """The stored label feature of the label spec (none without labels)."""
    spec = info["label_spec"]
    if spec["type"] == "class":
        return {"label": {"dtype": "int64", "shape": []}}
    if spec["type"] == "multi_label":
        return {"label": {"dtype": "int64", "shape": None}}
    if spec["type"] == "regression":
        return {"label": {"dtype": "float32", "shape": [spec["size"]]}}
    return {}


def with_labels(inputs, parsed, info, options):
    """Adds `"labels"` in the form `label_mode` asks for (classification, text)."""
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
