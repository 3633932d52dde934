"""Property-based tests: the annotation parsers and the argument checks never
raise anything but their documented errors, with messages naming the input."""

import json
import os
import tempfile

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_datum import DatumDataset
from keras_datum import datum_format
from keras_datum.problems import classification
from keras_datum.problems import detection_layouts
from keras_datum.problems import text
from keras_datum.problems.labels import MAX_CLASSES

CASES = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
WORKDIR = tempfile.mkdtemp(prefix="keras_datum_fuzz_")
# Integers of any size: an id taken for a label, a 400-digit number (no
# float holds it), the edges of int64.
any_integer = st.one_of(
    st.integers(),
    st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1, 2**64, 2000000000]),
)


def _write(name, content):
    path = os.path.join(WORKDIR, name)
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
        f.write(content)
    return path


def _documented(call, path):
    """`call()`'s result, or None when it raised the documented ValueError
    naming `path` (any other exception fails the test)."""
    try:
        return call()
    except ValueError as e:
        assert os.path.basename(path) in str(e), str(e)
        return None


xml_text = st.one_of(
    st.text(max_size=300),
    st.builds(
        lambda name, coords, filename: (
            f"<annotation><filename>{filename}</filename><object><name>{name}</name><bndbox>"
            + "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), coords))
            + "</bndbox></object></annotation>"
        ),
        st.text(max_size=10),
        st.lists(st.one_of(st.integers(-5, 500).map(str), any_integer.map(str), st.text(max_size=4)), min_size=0, max_size=4),
        st.text(max_size=20),
    ),
)


@CASES
@given(xml_text)
def test_voc_xml_parser(content):
    path = _write("fuzz.xml", content)
    _documented(lambda: detection_layouts.parse_voc_xml(path), path)


json_values = st.recursive(
    st.none() | st.booleans() | any_integer | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
ids = st.one_of(st.integers(0, 3), any_integer, st.text(max_size=2), json_values)
bbox = st.one_of(st.lists(st.one_of(st.integers(-5, 50), any_integer, st.floats(), st.booleans()), max_size=5), json_values)


def _entries(required, optional):
    return st.lists(st.fixed_dictionaries(required, optional=optional), max_size=3)


coco_like = st.fixed_dictionaries(
    {},
    optional={
        "images": st.one_of(_entries({"id": ids, "file_name": st.one_of(st.text(max_size=6), json_values)}, {"width": json_values}), json_values),
        "annotations": st.one_of(
            _entries({"image_id": ids, "category_id": ids, "bbox": bbox}, {"iscrowd": json_values}),
            _entries({}, {"image_id": ids, "bbox": bbox}),
        ),
        "categories": st.one_of(_entries({"id": ids, "name": json_values}, {}), json_values),
    },
)


@CASES
@given(st.one_of(coco_like.map(json.dumps), json_values.map(json.dumps), st.text(max_size=200)))
def test_coco_json_parser(content):
    path = _write("instances_fuzz.json", content)
    parsed = _documented(lambda: detection_layouts.parse_coco_json(path), path)
    if parsed is not None:
        # Floats, so that no box arithmetic at export can overflow.
        assert all(type(v) is float for ann in parsed[1] for v in ann["bbox"])


yolo_line = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.one_of(st.integers(-3, 5).map(str), any_integer.map(str), st.floats(-1, 2).map(str), st.floats().map(str), st.text(max_size=3)),
        max_size=6,
    ).map(" ".join),
)


@CASES
@given(st.lists(yolo_line, max_size=5).map("\n".join))
def test_yolo_label_parser(content):
    path = _write("fuzz.txt", content)
    parsed = _documented(lambda: detection_layouts.parse_yolo_labels(path, num_classes=3), path)
    if parsed is not None:
        assert all(0 <= c < 3 for c in parsed[1])


@CASES
@given(st.one_of(json_values.map(json.dumps), st.text(max_size=200)))
def test_datum_text_json_parser(content):
    path = _write("fuzz_text.json", content)
    _documented(lambda: text.parse_datum_json(path), path)


csv_cell = st.one_of(
    st.integers(-3, 9).map(str),
    any_integer.map(str),
    st.sampled_from(["1e400", "-1e39", "9" * 5000]),
    st.lists(any_integer, max_size=2).map(lambda v: f'"[{", ".join(map(str, v))}]"'),
    st.floats(-5, 5, allow_nan=False).map(str),
    st.lists(st.integers(0, 4), max_size=3).map(lambda v: f'"[{", ".join(map(str, v))}]"'),
    st.text(alphabet="abc[]0123456789.,;- \"'", max_size=8),
)


@CASES
@given(
    header=st.lists(st.sampled_from(["filename", "label", "x", "y", ""]), min_size=0, max_size=3),
    rows=st.lists(st.lists(csv_cell, min_size=0, max_size=3), max_size=4),
    names=st.lists(st.sampled_from(["a", "b", "missing", "../up", "/abs", ""]), max_size=4),
)
def test_csv_layout_parser(header, rows, names):
    root = tempfile.mkdtemp(dir=WORKDIR)
    os.makedirs(os.path.join(root, "train"))
    for stem in ("a", "b"):
        with open(os.path.join(root, "train", stem + ".png"), "wb") as f:
            f.write(b"\x89PNG")  # Content is not read while parsing the layout.
    lines = [",".join(header)] + [",".join([n, *r]) for n, r in zip(names, rows)]
    _write_csv = os.path.join(root, "train.csv")
    with open(_write_csv, "w") as f:
        f.write("\n".join(lines) + "\n")
    layout = _documented(lambda: classification.find_layout(root), _write_csv)
    if layout is not None and layout.name == "csv":
        _assert_labels_fit(layout)


def _assert_labels_fit(layout):
    """Class labels index the class list (of at most MAX_CLASSES, or one a
    row); regression targets fit float32."""
    spec = layout.info["label_spec"]
    labels = [x for r in layout.splits["train"] for x in r.labels.get("label", [])]
    if spec["type"] in ("class", "multi_label"):
        assert spec["num_classes"] <= max(MAX_CLASSES, len(layout.splits["train"]))
        assert all(0 <= x < spec["num_classes"] for x in labels)
    elif spec["type"] == "regression":
        assert all(abs(x) <= 3.4028234663852886e38 for x in labels)


@settings(CASES, max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["image", "label", "xmin"]),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["int", "float", "string"]), "shape": st.one_of(st.lists(any_integer, max_size=3), json_values)},
        ),
        min_size=1,
    )
)
def test_datum_mapping_parser(mapping):
    folder = tempfile.mkdtemp(dir=WORKDIR)
    path = os.path.join(folder, datum_format.MAPPING_FILE)
    with open(path, "w") as f:
        json.dump(mapping, f)
    _documented(lambda: datum_format.read_mapping(folder), path)


arguments = st.fixed_dictionaries(
    {},
    optional={
        "image_size": st.one_of(st.tuples(st.integers(-2, 300), st.integers(-2, 300)), st.integers(), st.text(max_size=3), st.none()),
        "batch_size": st.one_of(st.integers(-2, 64), st.floats(), st.none(), st.text(max_size=2)),
        "validation_split": st.one_of(st.floats(-1, 2), st.integers(-1, 2), st.none(), st.text(max_size=2)),
        "label_mode": st.one_of(st.sampled_from(["int", "categorical", "binary", None, "onehot"]), st.integers()),
        "color_mode": st.sampled_from(["rgb", "grayscale", "rgba", "cmyk", 3]),
        "seed": st.one_of(st.integers(), st.floats(), st.none()),
        "max_boxes": st.one_of(st.integers(-2, 10), st.none(), st.text(max_size=2)),
        "bucket_boundaries": st.one_of(st.lists(st.integers(-2, 10), max_size=3), st.none(), st.integers()),
        "cache": st.sampled_from(["auto", True, False, "yes"]),
        "reexport": st.sampled_from(["auto", "never", "always", "sometimes"]),
    },
)


@CASES
@given(arguments)
def test_argument_checks(kwargs):
    try:
        DatumDataset(WORKDIR, verbose=False, mixed_precision="float32", **kwargs)
    except ValueError as e:
        assert "Received" in str(e) or "Only one of" in str(e), str(e)
