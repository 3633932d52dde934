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
from keras_datum.problems import classification
from keras_datum.problems import detection
from keras_datum.problems import text

CASES = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
WORKDIR = tempfile.mkdtemp(prefix="keras_datum_fuzz_")


def _write(name, content):
    path = os.path.join(WORKDIR, name)
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
        f.write(content)
    return path


def _documented(call, path):
    try:
        call()
    except ValueError as e:
        assert os.path.basename(path) in str(e), str(e)


xml_text = st.one_of(
    st.text(max_size=300),
    st.builds(
        lambda name, coords, filename: (
            f"<annotation><filename>{filename}</filename><object><name>{name}</name><bndbox>"
            + "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), coords))
            + "</bndbox></object></annotation>"
        ),
        st.text(max_size=10),
        st.lists(st.one_of(st.integers(-5, 500).map(str), st.text(max_size=4)), min_size=0, max_size=4),
        st.text(max_size=20),
    ),
)


@CASES
@given(xml_text)
def test_voc_xml_parser(content):
    path = _write("fuzz.xml", content)
    _documented(lambda: detection.parse_voc_xml(path), path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
ids = st.one_of(st.integers(0, 3), st.text(max_size=2), json_values)
bbox = st.one_of(st.lists(st.one_of(st.integers(-5, 50), st.floats(allow_nan=False), st.booleans()), max_size=5), json_values)


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
    _documented(lambda: detection.parse_coco_json(path), path)


yolo_line = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.integers(-3, 5).map(str), st.floats(-1, 2).map(str), st.text(max_size=3)), max_size=6).map(" ".join),
)


@CASES
@given(st.lists(yolo_line, max_size=5).map("\n".join))
def test_yolo_label_parser(content):
    path = _write("fuzz.txt", content)
    _documented(lambda: detection.parse_yolo_labels(path, num_classes=3), path)


@CASES
@given(st.one_of(json_values.map(json.dumps), st.text(max_size=200)))
def test_datum_text_json_parser(content):
    path = _write("fuzz_text.json", content)
    _documented(lambda: text.parse_datum_json(path), path)


csv_cell = st.one_of(
    st.integers(-3, 9).map(str),
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
    _documented(lambda: classification.find_layout(root), _write_csv)


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
