"""Hostile numbers in labels and annotations: an id column taken for a label,
integers of hundreds of digits, values beyond float32. Each is refused with a
ValueError naming the file (and the line or entry), before anything big is
built."""

import json
import os
import re

import numpy as np
import pytest
from PIL import Image
from detection_data import draw_items
from detection_data import write_coco
from detection_data import write_voc
from detection_data import write_yolo
from test_classification import make_csv_layout
from test_datum_format import write_datum_export

from keras_datum import DatumDataset
from keras_datum import datum_format
from keras_datum.problems import labels

HUGE = 10**400


def _export(root, tmp_path, **kwargs):
    """Exports `root` (the export runs when the dataset is first asked)."""
    kwargs.setdefault("cache_dir", tmp_path / "cache")
    ds = DatumDataset(root, image_size=(8, 8), validation_split=None, verbose=False, **kwargs)
    ds.info
    return ds


# --- Datum's CSV layout ---------------------------------------------------------


def test_an_id_column_taken_for_the_label_is_refused_before_the_class_list_is_built(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 2000000000), ("c", 1)]})
    with pytest.raises(
        ValueError,
        match=r"train\.csv:3: the class label 2000000000 would make 2000000001 classes .* "
        r"more than the 3 examples and the limit of 100000\. Is this column an id",
    ):
        _export(root, tmp_path)


def test_a_multi_label_list_holding_an_id_is_refused(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", "[0, 1]"), ("b", f"[1, {HUGE}]")]})
    with pytest.raises(ValueError, match=r"train\.csv:3: the class label 10+\.\.\. \(401 characters\) would make"):
        _export(root, tmp_path)


def test_more_classes_than_the_cap_are_read_when_there_are_as_many_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(labels, "MAX_CLASSES", 2)
    rows = [(f"img{i}", i) for i in range(4)]
    ds = _export(make_csv_layout(tmp_path / "src", {"train": rows}), tmp_path)
    assert ds.class_names == ["0", "1", "2", "3"]
    root = make_csv_layout(tmp_path / "few", {"train": [("a", 0), ("b", 3)]})
    with pytest.raises(ValueError, match=r"train\.csv:3: the class label 3 would make 4 classes"):
        _export(root, tmp_path)


def test_a_huge_negative_label_is_refused_naming_the_line(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", -HUGE)]})
    with pytest.raises(ValueError, match=r"train\.csv:3: class labels must be >= 0\. Received: -100000"):
        _export(root, tmp_path)


def test_an_integer_too_long_for_python_is_refused_naming_the_line(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", "9" * 5000)]})
    with pytest.raises(ValueError, match=r"train\.csv:3: the integer 9+\.\.\. \(5000 characters\) has 5000 digits"):
        _export(root, tmp_path)


@pytest.mark.parametrize(
    "header, first, second",
    [
        (("filename", "label"), 0.5, "1e400"),
        (("filename", "label"), 0.5, "1e39"),  # A float64, but past float32.
        (("filename", "x", "y"), (0.5, 1), (0.5, HUGE)),
        (("filename", "label"), "[0.5, 1.5]", "[0.5, 1e400]"),
    ],
)
def test_a_regression_target_beyond_float32_is_refused_naming_the_line(tmp_path, header, first, second):
    cells = lambda value: value if isinstance(value, tuple) else (value,)  # noqa: E731
    rows = [("a", *cells(first)), ("b", *cells(second))]
    root = make_csv_layout(tmp_path / "src", {"train": rows}, header=header)
    with pytest.raises(ValueError, match=r"train\.csv:3: the regression target .* does not fit in float32"):
        _export(root, tmp_path)


# --- Detection annotations ----------------------------------------------------


def _edit_json(path, edit):
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("value", [HUGE, -HUGE])
def test_a_coco_bbox_of_a_400_digit_integer_is_refused_naming_the_file(tmp_path, value):
    root = write_coco(tmp_path / "src", {"train": draw_items(3)})
    path = os.path.join(root, "annotations", "instances_train.json")
    _edit_json(path, lambda data: data["annotations"][0]["bbox"].__setitem__(2, value))
    with pytest.raises(ValueError, match=r"instances_train\.json: annotations\[0\]\.bbox holds an integer too large"):
        _export(root, tmp_path)


def test_coco_ids_of_400_digits_are_ids_like_any_other(tmp_path):
    root = write_coco(tmp_path / "src", {"train": draw_items(3)})
    path = os.path.join(root, "annotations", "instances_train.json")

    def edit(data):
        data["images"][0]["id"] = HUGE
        for ann in data["annotations"]:
            ann["image_id"] = HUGE if ann["image_id"] == 1 else ann["image_id"]
            ann["category_id"] = HUGE if ann["category_id"] == 7 else ann["category_id"]
        data["categories"][0]["id"] = HUGE

    _edit_json(path, edit)
    ds = _export(root, tmp_path)
    assert ds.class_names == ["cat", "dog"]
    assert ds.num_examples == {"train": 3}


def test_voc_and_yolo_coordinates_of_400_digits_are_dropped_boxes(tmp_path):
    items = draw_items(3)  # img001 has one box, img002 two.
    voc = write_voc(tmp_path / "voc", items)
    path = os.path.join(voc, "Annotations", "img001.xml")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(re.sub(r"<xmax>\d+</xmax>", f"<xmax>{HUGE}</xmax>", text, count=1))
    yolo = write_yolo(tmp_path / "yolo", {"train": items})
    with open(os.path.join(yolo, "labels", "train", "img001.txt"), "w") as f:
        f.write(f"0 0.5 0.5 {HUGE} 0.2\n")
    for root in (voc, yolo):
        ds = _export(root, tmp_path, cache_dir=tmp_path / ("cache_" + os.path.basename(root)))
        assert ds.info["splits"]["train"]["boxes_dropped"] == 1, root


def test_a_yolo_class_of_400_digits_is_refused_naming_the_line(tmp_path):
    root = write_yolo(tmp_path / "src", {"train": draw_items(3)})
    with open(os.path.join(root, "labels", "train", "img001.txt"), "a") as f:
        f.write(f"{HUGE} 0.5 0.5 0.2 0.2\n")
    with pytest.raises(ValueError, match=r"img001\.txt:2: class 1000.* is outside 0\.\.1"):
        _export(root, tmp_path)


# --- datum exports ----------------------------------------------------------------


def _datum_export(tmp_path, labels):
    image = str(tmp_path / "a.png")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(image)
    datums = [{"image": image, "label": label} for label in labels]
    return write_datum_export(tmp_path / "export", {"train": datums})


def test_a_datum_export_label_that_is_an_id_is_refused_naming_the_shard(tmp_path):
    export = _datum_export(tmp_path, [0, 2**62])
    with pytest.raises(ValueError, match=r"train-00000-of-00001\.tfrecord: the label column 'label' holds 4611686018427387904"):
        datum_format.read_metadata(export)


@pytest.mark.parametrize("shape", [[HUGE], [2**40, 2**40], [-1], [1.5]])
def test_a_datum_mapping_shape_that_fits_no_tensor_is_refused_naming_the_file(tmp_path, shape):
    export = _datum_export(tmp_path, [0.5, 1.5])
    path = os.path.join(export, datum_format.MAPPING_FILE)
    _edit_json(path, lambda mapping: mapping["label"].__setitem__("shape", shape))
    with pytest.raises(ValueError, match=r"datum_to_type_and_shape_mapping\.json: feature 'label' needs .* a shape list of sizes"):
        datum_format.read_metadata(export)
