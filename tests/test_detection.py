"""Detection: VOC, COCO and YOLO round trips, box formats, box-aware augmentation."""

import json
import os
import shutil
import warnings

import keras
import keras_cv
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from detection_data import CLASS_NAMES, HEIGHT, WIDTH, as_xyxy, draw_items, write_coco, write_voc, write_yolo

from keras_datum import DatumDataset


def _sources(tmp_path, kind, items):
    if kind == "voc":
        return write_voc(tmp_path / "voc", items)
    if kind == "coco":
        return write_coco(tmp_path / "coco", {"train": items})
    return write_yolo(tmp_path / "yolo", {"train": items})


def _examples(dataset):
    out = []
    for x, y in dataset:
        out.append((x.numpy(), y["boxes"].numpy(), y["labels"].numpy()))
    return out


def _match_sources(examples, items, fmt, image_size, tolerance):
    """Each example's boxes and classes equal exactly one source item's."""
    remaining = {stem: (np.array(b, np.float32).reshape(-1, 4), c) for stem, b, c, _ in items}
    for _, boxes, classes in examples:
        got = as_xyxy(boxes, fmt, image_size)
        found = None
        for stem, (want, want_classes) in remaining.items():
            if len(want) == len(got) and list(classes) == want_classes and np.allclose(got, want, atol=tolerance):
                found = stem
                break
        assert found is not None, (got, classes)
        del remaining[found]
    assert not remaining


@pytest.mark.parametrize("kind", ["voc", "coco", "yolo"])
@pytest.mark.parametrize("fmt", ["xyxy", "rel_xyxy", "xywh", "center_xywh", "yxyx", "rel_yxyx"])
def test_round_trip_boxes_in_every_format(tmp_path, kind, fmt):
    items = draw_items(6)
    root = _sources(tmp_path, kind, items)
    ds = DatumDataset(
        root, image_size=(HEIGHT, WIDTH), bounding_box_format=fmt,
        validation_split=None, batch_size=None, shuffle=False, verbose=False,
    )
    assert ds.info["problem"] == "detection"
    assert ds.info["layout"] == kind
    assert ds.class_names == CLASS_NAMES
    counts = [0, 0]
    for _, _, classes, _ in items:
        for c in classes:
            counts[c] += 1
    assert ds.info["splits"]["train"]["objects"] == counts
    _match_sources(_examples(ds.train()), items, fmt, (HEIGHT, WIDTH), 1e-3 * WIDTH)


def test_pad_to_aspect_ratio_moves_boxes_with_the_pixels(tmp_path):
    items = draw_items(6)
    root = write_voc(tmp_path / "voc", items)
    # 40x60 into 90x90: scaled 1.5x to 60x90, 15 rows of padding on top.
    ds = DatumDataset(root, image_size=(90, 90), validation_split=None, batch_size=None,
                      shuffle=False, verbose=False)
    scaled = [(stem, [[b[0] * 1.5, b[1] * 1.5 + 15, b[2] * 1.5, b[3] * 1.5 + 15] for b in boxes], classes, None)
              for stem, boxes, classes, _ in items]
    examples = _examples(ds.train())
    _match_sources(examples, scaled, "xyxy", (90, 90), 0.01)
    for x, boxes, _ in examples:
        assert x[:14].max() == 0 and x[-14:].max() == 0  # The padding bands.
        for x1, y1, x2, y2 in boxes:
            inside = x[int(y1) + 2 : int(y2) - 2, int(x1) + 2 : int(x2) - 2]
            assert inside.size == 0 or inside.min() > 200


def test_padding_of_a_fractional_scale_puts_boxes_on_the_pixels(tmp_path):
    # 40x60 into 64x64 scales the height to 42.67 rows: TensorFlow pads from
    # that unrounded size (10 rows on top), not from the 42 rows (11).
    white = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    root = write_voc(tmp_path / "voc", [("all", [[0, 0, WIDTH, HEIGHT]], [0], white)])
    ds = DatumDataset(root, image_size=(64, 64), validation_split=None, batch_size=None, verbose=False)
    (x, boxes, _), = _examples(ds.train())
    rows = np.nonzero(x.max(axis=(1, 2)) > 0)[0]
    np.testing.assert_allclose(boxes, [[0, rows[0], 64, rows[-1] + 1]], atol=1e-4)
    assert rows[0] == 10


def test_dense_padding_and_ragged_batches(tmp_path):
    root = write_voc(tmp_path / "voc", draw_items(6))
    dense = DatumDataset(root, image_size=(40, 60), max_boxes=3, batch_size=3, validation_split=None, verbose=False)
    x, y = next(iter(dense.train()))
    assert y["boxes"].shape == (3, 3, 4) and y["labels"].shape == (3, 3)
    assert set(np.unique(y["labels"].numpy())) <= {-1.0, 0.0, 1.0}
    assert (y["labels"].numpy() == -1).any()
    ragged = DatumDataset(root, image_size=(40, 60), batch_size=3, validation_split=None, verbose=False)
    _, y = next(iter(ragged.train()))
    assert isinstance(y["boxes"], tf.RaggedTensor)
    keras_cv_key = DatumDataset(root, image_size=(40, 60), batch_size=3,
                                bounding_box_class_key="classes", validation_split=None,
                                verbose=False)
    _, y = next(iter(keras_cv_key.train()))
    assert set(y) == {"boxes", "classes"}


BATCH_BOX_LAYERS = {
    "keras_cv_mosaic": (lambda: keras_cv.layers.Mosaic(bounding_box_format="xyxy", seed=1), "classes"),
    "keras_cv_flip": (lambda: keras_cv.layers.RandomFlip("horizontal", bounding_box_format="xyxy", seed=1), "classes"),
    "keras_flip": (lambda: keras.layers.RandomFlip("horizontal", bounding_box_format="xyxy", seed=1), "labels"),
}


@pytest.mark.parametrize("max_boxes", [2, None])
@pytest.mark.parametrize("layer", sorted(BATCH_BOX_LAYERS))
def test_max_boxes_holds_after_a_batch_augmentation(tmp_path, layer, max_boxes):
    # KerasCV's batch layers hand back ragged boxes (Mosaic more of them);
    # Keras's hands back dense ones and moves the padding boxes too.
    make_layer, key = BATCH_BOX_LAYERS[layer]
    three = [[2, 4, 12, 20], [16, 2, 30, 10], [3, 22, 9, 30]]
    white = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    items = [(f"i{i}", three[: 1 + i % 3], [1, 0, 1][: 1 + i % 3], white) for i in range(8)]
    root = write_voc(tmp_path / "voc", items)
    ds = DatumDataset(root, image_size=(32, 32), batch_size=4, max_boxes=max_boxes,
                      bounding_box_class_key=key, validation_split=None, verbose=False)
    train = ds.train(batch_augment=make_layer())
    if max_boxes:
        assert train.element_spec[1]["boxes"] == tf.TensorSpec((None, 2, 4), tf.float32)
        assert train.element_spec[1][key] == tf.TensorSpec((None, 2), tf.float32)
    padded = 0
    for _, y in train:
        if not max_boxes:
            # Ragged, as max_boxes=None promises, and without padding rows.
            assert isinstance(y["boxes"], tf.RaggedTensor) and isinstance(y[key], tf.RaggedTensor)
            assert set(np.unique(y[key].flat_values.numpy())) <= {0.0, 1.0}
            continue
        classes = y[key].numpy()
        # Each image keeps at most two of its boxes; padding is class -1 and box -1.
        assert set(np.unique(classes)) <= {-1.0, 0.0, 1.0}
        assert (y["boxes"].numpy()[classes == -1] == -1).all()
        padded += int((classes == -1).sum())
    assert not max_boxes or layer == "keras_cv_mosaic" or padded > 0


def test_max_boxes_that_cuts_boxes_off_warns(tmp_path):
    three = [[2, 4, 12, 20], [16, 2, 30, 10], [3, 22, 9, 30]]
    white = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    # Images with 1, 2, 3, 1, 2, 3 boxes.
    items = [(f"i{i}", three[: 1 + i % 3], [1, 0, 1][: 1 + i % 3], white) for i in range(6)]
    root = write_voc(tmp_path / "voc", items)

    def dataset(max_boxes):
        return DatumDataset(root, image_size=(32, 32), batch_size=4, max_boxes=max_boxes,
                            bounding_box_class_key="classes", validation_split=None,
                            verbose=False)

    assert dataset(None).info["splits"]["train"]["images_by_box_count"] == [0, 2, 2, 2]
    with pytest.warns(UserWarning, match=r"max_boxes=2 cuts boxes off 2 of the train split's 6 "
                      r"images, which have up to 3: only the first 2 of each are kept") as record:
        dataset(2).train()
    assert [w.filename for w in record] == [__file__]
    mosaic = keras_cv.layers.Mosaic(bounding_box_format="xyxy")
    with pytest.warns(UserWarning, match=r"max_boxes=3 cuts boxes off the mosaics: .* up to 12 in "
                      r"the train split.* Pass max_boxes=12 or more"):
        dataset(3).train(batch_augment=mosaic)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset(3).train()
        dataset(12).train(batch_augment=mosaic)
        dataset(None).train(batch_augment=mosaic)


@pytest.mark.parametrize("make_layer, key, match", [
    # Another format: the boxes would be moved to the wrong place, silently.
    (lambda: keras_cv.layers.RandomFlip("horizontal", bounding_box_format="xyxy"), "classes",
     r"RandomFlip \(name='random_flip.*'\) reads boxes as 'xyxy', and this dataset's are 'xywh'"),
    (lambda: keras.layers.RandomFlip("horizontal", bounding_box_format="xyxy"), "labels",
     r"reads boxes as 'xyxy', and this dataset's are 'xywh'.*bounding_box_format='xywh'"),
    # Keras's layers need a format, and read the classes under "labels".
    (lambda: keras.layers.RandomBrightness(0.2), "labels",
     r"is one of Keras's preprocessing layers, which need a bounding_box_format .*'xywh'"),
    (lambda: keras.layers.RandomFlip("horizontal", bounding_box_format="xywh"), "classes",
     r"reads the classes of the boxes under 'labels', and this dataset puts them under 'classes'"),
    (lambda: keras_cv.layers.RandomFlip("horizontal", bounding_box_format="xywh"), "labels",
     r"reads the classes of the boxes under 'classes', .* bounding_box_class_key='classes'"),
    # Inside a container, and a user's subclass of a Keras layer.
    (lambda: keras.layers.Pipeline([keras_cv.layers.RandomFlip("horizontal", bounding_box_format="xyxy")]),
     "classes", r"reads boxes as 'xyxy', and this dataset's are 'xywh'"),
    (lambda: keras.Sequential([keras.layers.RandomFlip("horizontal", bounding_box_format="xyxy")]),
     "labels", r"reads boxes as 'xyxy', and this dataset's are 'xywh'"),
    (lambda: type("MyFlip", (keras.layers.RandomFlip,), {})("horizontal", bounding_box_format="xywh"),
     "classes", r"MyFlip .* reads the classes of the boxes under 'labels'"),
])
def test_a_box_layer_that_would_misread_the_boxes_is_refused_before_export(tmp_path, make_layer, key, match):
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(_sources(tmp_path, "voc", draw_items(4)), bounding_box_format="xywh",
                      bounding_box_class_key=key, cache_dir=cache_dir, verbose=False)
    with pytest.raises(ValueError, match=match):
        ds.train(augment=[make_layer()])
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_a_users_subclass_of_a_keras_box_layer_reads_labels(tmp_path):
    class MyFlip(keras.layers.RandomFlip):
        pass

    ds = DatumDataset(_sources(tmp_path, "voc", draw_items(4)), image_size=(HEIGHT, WIDTH),
                      bounding_box_class_key="labels", batch_size=2, verbose=False)
    batches = list(ds.train(augment=keras.layers.Pipeline([MyFlip("horizontal", bounding_box_format="xyxy")])))
    assert sum(int(x.shape[0]) for x, _ in batches) == ds.num_examples["train"]


def _one_object(tmp_path):
    pixels = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    pixels[10:30, 5:20] = 255
    items = [("only", [[5, 10, 20, 30]], [0], pixels)] * 1
    return write_voc(tmp_path / "voc", items)


@pytest.mark.parametrize("make_flip, key", [
    (lambda: keras_cv.layers.RandomFlip("horizontal", bounding_box_format="xyxy"), "classes"),
    (lambda: keras.layers.RandomFlip("horizontal", bounding_box_format="xyxy"), "labels"),
])
def test_flipped_box_still_covers_the_object(tmp_path, make_flip, key):
    root = _one_object(tmp_path)
    ds = DatumDataset(root, image_size=(HEIGHT, WIDTH), validation_split=None, batch_size=None,
                      bounding_box_class_key=key, verbose=False)
    seen_flipped = False
    for seed in range(6):
        x, y = next(iter(ds.train(augment=make_flip(), seed=seed)))
        x, (x1, y1, x2, y2) = x.numpy(), np.round(y["boxes"].numpy()[0]).astype(int)
        assert x[y1:y2, x1:x2].min() > 200, "box must cover the object"
        assert x.sum() == x[y1:y2, x1:x2].sum(), "nothing outside the box"
        seen_flipped |= x1 > 30
    assert seen_flipped


def test_clipped_and_degenerate_boxes_are_counted(tmp_path):
    pixels = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    items = [("a", [[-5, 2, 10, 12], [20, 5, 20, 9], [30, 30, 70, 50], [1, 1, 8, 8]], [0, 1, 1, 0], pixels)]
    root = write_voc(tmp_path / "voc", items)
    ds = DatumDataset(root, image_size=(HEIGHT, WIDTH), validation_split=None, batch_size=None, verbose=False)
    split = ds.info["splits"]["train"]
    assert split["boxes_clipped"] == 2 and split["boxes_dropped"] == 1
    _, y = next(iter(ds.train()))
    np.testing.assert_allclose(y["boxes"].numpy(), [[0, 2, 10, 12], [30, 30, 60, 40], [1, 1, 8, 8]], atol=1e-3)


def test_voc_split_lists_and_missing_image_is_reported(tmp_path):
    items = draw_items(6)
    root = write_voc(tmp_path / "voc", items, split_lists={"train": [i[0] for i in items[:4]], "val": [i[0] for i in items[4:]]})
    os.remove(os.path.join(root, "JPEGImages", "img001.png"))
    ds = DatumDataset(root, image_size=(HEIGHT, WIDTH), verbose=False)
    with pytest.warns(UserWarning, match="1 invalid files"):
        ds.export()
    assert ds.num_examples == {"train": 3, "val": 2}
    assert ds.invalid_files[0]["file"] == "JPEGImages/img001.png"
    assert "cannot read file" in ds.invalid_files[0]["reason"]


def test_class_names_from_the_xml_when_no_class_file(tmp_path):
    root = write_voc(tmp_path / "voc", draw_items(6), class_file=False)
    assert DatumDataset(root, verbose=False).class_names == ["cat", "dog"]


def test_yolo_with_classes_txt_and_val_split(tmp_path):
    items = draw_items(6)
    root = write_yolo(tmp_path / "yolo", {"train": items[:4], "val": items[4:]}, names_file="classes.txt")
    # Saved by a Windows tool: a byte order mark and CRLF line ends.
    labels = sorted(os.listdir(os.path.join(root, "labels", "train")))
    for path in (os.path.join(root, "classes.txt"), os.path.join(root, "labels", "train", labels[0])):
        with open(path, "rb") as f:
            text = f.read()
        with open(path, "wb") as f:
            f.write(b"\xef\xbb\xbf" + text.replace(b"\n", b"\r\n"))
    ds = DatumDataset(root, image_size=(HEIGHT, WIDTH), verbose=False)
    assert ds.num_examples == {"train": 4, "val": 2}
    assert ds.class_names == list(CLASS_NAMES)


def test_an_example_in_two_voc_split_lists_is_refused(tmp_path):
    items = draw_items(4)
    stems = [i[0] for i in items]
    root = write_voc(tmp_path / "voc", items, split_lists={"train": stems[:3], "val": stems[2:]})
    with pytest.raises(ValueError, match=r"val\.txt:1 lists 'img002', which .*train\.txt:3 lists"):
        DatumDataset(root, verbose=False).export()


def test_two_voc_annotations_of_one_image_are_refused(tmp_path):
    root = write_voc(tmp_path / "voc", draw_items(3))
    path = os.path.join(root, "Annotations", "img002.xml")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("img002.png", "img001.png"))
    with pytest.raises(ValueError, match=r"img001\.xml' and .*img002\.xml' both annotate .*img001\.png'"):
        DatumDataset(root, verbose=False).export()


def test_yolo_folders_that_would_mix_up_labels_are_refused(tmp_path):
    items = draw_items(4)
    root = write_yolo(tmp_path / "a", {"train": items[:2], "val": items[2:3], "validation": items[3:]})
    with pytest.raises(ValueError, match=r"has both 'val/' and 'validation/' folders"):
        DatumDataset(root, verbose=False).export()
    root = write_yolo(tmp_path / "b", {"train": items})
    Image.fromarray(items[1][3]).save(os.path.join(root, "images", "train", "img001.jpg"))
    with pytest.raises(ValueError, match=r"img001\.jpg' and .*img001\.png' share the name 'img001'"):
        DatumDataset(root, verbose=False).export()
    root = write_yolo(tmp_path / "c", {"train": items[:2], "val": items[2:]})
    os.rename(os.path.join(root, "labels", "val"), os.path.join(root, "labels", "valid"))
    with pytest.raises(ValueError, match=r"images/val' but no .*labels/val'"):
        DatumDataset(root, verbose=False).export()


def test_roboflow_and_ultralytics_yolo_folder_names_are_read(tmp_path):
    # Roboflow's export (train/images/, valid/images/, ...) read as class
    # folders would train on the split names as classes; Ultralytics's
    # coco128 names its folders images/train2017/.
    items = draw_items(8)
    parts = {"train": items[:4], "val": items[4:6], "test": items[6:]}
    standard = DatumDataset(write_yolo(tmp_path / "std", parts), verbose=False).info
    for root in (
        write_yolo(tmp_path / "rf", {"train": parts["train"], "valid": parts["val"], "test": parts["test"]},
                   split_first=True),
        write_yolo(tmp_path / "ul", {"train2017": parts["train"], "val2017": parts["val"], "test2017": parts["test"]}),
    ):
        info = DatumDataset(root, verbose=False).info
        assert (info["problem"], info["layout"], info["class_names"]) == ("detection", "yolo", list(CLASS_NAMES))
        for split in ("train", "val", "test"):
            assert info["splits"][split]["num_examples"] == len(parts[split])
            assert info["splits"][split]["objects"] == standard["splits"][split]["objects"]


def test_yolo_folders_that_would_be_left_out_are_refused(tmp_path):
    items = draw_items(4)
    root = write_yolo(tmp_path / "a", {"train": items[:3], "dev": items[3:]})
    with pytest.raises(ValueError, match=r"images' holds 'dev'/, which is not a split folder .* would be left out"):
        DatumDataset(root, verbose=False).export()
    root = write_yolo(tmp_path / "b", {"train": items[:3], "extra": items[3:]}, split_first=True)
    with pytest.raises(ValueError, match=r"b' holds 'extra'/, which is not a split folder"):
        DatumDataset(root, verbose=False).export()
    root = write_yolo(tmp_path / "c", {"train": items[:2], "val": items[2:3], "valid": items[3:]}, split_first=True)
    with pytest.raises(ValueError, match=r"has both 'val/' and 'valid/' folders"):
        DatumDataset(root, verbose=False).export()
    # A Roboflow split with one of its two folders was left out silently.
    for kept, gone in (("images", "labels"), ("labels", "images")):
        root = write_yolo(tmp_path / f"d_{kept}", {"train": items[:3], "test": items[3:]}, split_first=True)
        shutil.rmtree(os.path.join(root, "test", gone))
        with pytest.raises(ValueError, match=rf"has '.*test/{kept}' but no '.*test/{gone}': each split needs"):
            DatumDataset(root, verbose=False).export()


def test_yolo_label_files_without_an_image_are_named(tmp_path):
    items = draw_items(4)
    root = write_yolo(tmp_path / "yolo", {"train": items})
    os.remove(os.path.join(root, "images", "train", "img001.png"))  # Its label stays.
    with open(os.path.join(root, "labels", "train", "classes.txt"), "w") as f:
        f.write("cat\ndog\n")  # LabelImg's, beside the labels: not a label.
    with pytest.warns(UserWarning, match=r"1 label files in .*labels/train' have no image of their "
                      r"name in the split \(such as 'img001.txt'\): their objects are left out") as record:
        ds = DatumDataset(root, verbose=False)
        assert sum(ds.num_examples.values()) == 3
    assert len(record) == 1


def _edit_coco(root, split, edit):
    path = os.path.join(root, "annotations", f"instances_{split}.json")
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize(
    "split, edit, match",
    [
        # One image dropped, and its boxes given to the other.
        ("train", lambda d: d["images"][1].update(id=1), r"images\[0\] and images\[1\] have the same id 1"),
        # One image as two examples, each with some of its boxes.
        ("train", lambda d: d["images"][1].update(file_name="img000.png"),
         r"images\[0\] and images\[1\] have the same file_name 'img000.png'"),
        ("val", lambda d: d.update(categories=[{"id": 3, "name": "dog"}, {"id": 7, "name": "cat"}]),
         r"instances_val.json: categories\[0\] names category id 3 'dog', but .*instances_train.json: categories\[1\] names it 'cat'"),
        ("train", lambda d: d["categories"].append({"id": 9, "name": "cat"}),
         r"both name a category 'cat' \(ids 3 and 9\)"),
    ],
)
def test_coco_files_that_would_mislabel_are_refused(tmp_path, split, edit, match):
    items = draw_items(6)
    root = write_coco(tmp_path / "coco", {"train": items[:4], "val": items[4:]})
    _edit_coco(root, split, edit)
    with pytest.raises(ValueError, match=match):
        DatumDataset(root, verbose=False).export()


def test_a_detection_source_without_a_train_split_is_named(tmp_path):
    items = draw_items(4)
    root = write_coco(tmp_path / "coco", {"val": items})
    with pytest.raises(ValueError, match=r"has the splits \['val'\] but no 'train' split: add annotations/instances_train.json"):
        DatumDataset(root, verbose=False).export()
    root = write_voc(tmp_path / "voc", items, split_lists={"val": [i[0] for i in items]})
    with pytest.raises(ValueError, match=r"has the splits \['val'\] but no 'train' split: add a train.txt split list"):
        DatumDataset(root, verbose=False).export()


def _add_coco_category(root, category):
    path = os.path.join(root, "annotations", "instances_train.json")
    with open(path) as f:
        data = json.load(f)
    data["categories"].append(category)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize(
    "kind, corrupt, match",
    [
        ("voc", lambda r: open(os.path.join(r, "Annotations", "img000.xml"), "w").write("<annotation><object>"),
         r"img000.xml: malformed XML"),
        ("voc", lambda r: open(os.path.join(r, "Annotations", "img001.xml"), "w").write(
            "<annotation><object><name>cat</name><bndbox><xmin>a</xmin></bndbox></object></annotation>"),
         r"img001.xml: object 0 \('cat'\) has a <bndbox> without numeric"),
        ("voc", lambda r: open(os.path.join(r, "Annotations", "img001.xml"), "w").write(
            "<annotation><object><name>zebra</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>3</xmax><ymax>3</ymax></bndbox></object></annotation>"),
         r"img001.xml: unknown class 'zebra'"),
        ("voc", lambda r: open(os.path.join(r, "Annotations", "img001.xml"), "w").write(
            "<annotation><filename>../../etc/passwd</filename></annotation>"),
         r"outside the dataset root"),
        ("coco", lambda r: open(os.path.join(r, "annotations", "instances_train.json"), "w").write("{"),
         r"instances_train.json: malformed JSON"),
        ("coco", lambda r: open(os.path.join(r, "annotations", "instances_train.json"), "w").write(
            '{"images": [{"id": 1}]}'), r"instances_train.json: images\[0\] needs the fields"),
        ("yolo", lambda r: open(os.path.join(r, "labels", "train", "img001.txt"), "w").write("0 0.5 0.5\n"),
         r"img001.txt:1: expected 'class cx cy w h'"),
        ("yolo", lambda r: open(os.path.join(r, "labels", "train", "img001.txt"), "w").write("0 .5 .5 .1 .1\n9 .5 .5 .1 .1\n"),
         r"img001.txt:2: class 9 is outside 0..1"),
        # A form feed is no line break in a file: the bad line is line 3.
        ("yolo", lambda r: open(os.path.join(r, "labels", "train", "img001.txt"), "w").write("0 .5 .5 .1 .1\x0c\n0 .5 .5 .1 .1\n0 .5\n"),
         r"img001.txt:3: expected 'class cx cy w h'"),
        # Latin-1 text from an old tool: named, not a bare UnicodeDecodeError.
        ("yolo", lambda r: open(os.path.join(r, "labels", "train", "img001.txt"), "wb").write(b"0 .5 .5 .1 .1 # caf\xe9\n"),
         r"img001.txt: not UTF-8 text \(byte 0xe9 at offset 19\)"),
        ("voc", lambda r: open(os.path.join(r, "labels.txt"), "ab").write(b"caf\xe9\n"),
         r"labels.txt: not UTF-8 text \(byte 0xe9"),
        ("coco", lambda r: _add_coco_category(r, {"id": "7", "name": "string id"}),
         r"instances_train.json.*category ids mix integers and strings"),
    ],
)
def test_malformed_annotations_name_the_file(tmp_path, kind, corrupt, match):
    root = _sources(tmp_path, kind, draw_items(4))
    corrupt(root)
    with pytest.raises(ValueError, match=match):
        DatumDataset(root, verbose=False).export()


def test_crop_to_aspect_ratio_is_refused(tmp_path):
    root = write_voc(tmp_path / "voc", draw_items(3))
    with pytest.raises(ValueError, match="`crop_to_aspect_ratio=True` would cut boxes off"):
        DatumDataset(root, crop_to_aspect_ratio=True, verbose=False).export()


def test_bad_box_format():
    with pytest.raises(ValueError, match="Received: bounding_box_format='xyzw'"):
        DatumDataset("/nonexistent", bounding_box_format="xyzw")


@pytest.mark.slow
def test_keras_cv_yolov8_detector_fits(tmp_path):
    root = write_voc(tmp_path / "voc", draw_items(8))
    # KerasCV's models read the classes under "classes": its one argument.
    ds = DatumDataset(root, image_size=(64, 64), max_boxes=4, batch_size=4, validation_split=None,
                      bounding_box_class_key="classes", verbose=False)
    backbone = keras_cv.models.YOLOV8Backbone(
        stackwise_channels=[8, 16, 32, 64], stackwise_depth=[1, 1, 1, 1],
        include_rescaling=True, input_shape=(64, 64, 3),
    )
    model = keras_cv.models.YOLOV8Detector(
        num_classes=2, bounding_box_format="xyxy", backbone=backbone, fpn_depth=1
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), classification_loss="binary_crossentropy", box_loss="ciou")
    augment = keras_cv.layers.RandomFlip("horizontal", bounding_box_format="xyxy")
    history = model.fit(ds.train(augment=augment), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize("max_boxes", [None, 6])
def test_mosaic_and_jittered_resize_through_the_pipeline(tmp_path, max_boxes):
    root = write_voc(tmp_path / "voc", [item for item in draw_items(12) if item[1]])
    ds = DatumDataset(root, image_size=(64, 64), max_boxes=max_boxes, batch_size=4,
                      bounding_box_class_key="classes", validation_split=None, verbose=False)
    jitter = keras_cv.layers.JitteredResize(
        target_size=(64, 64), scale_factor=(0.8, 1.2), bounding_box_format="xyxy"
    )
    mosaic = keras_cv.layers.Mosaic(bounding_box_format="xyxy")
    x, y = next(iter(ds.train(augment=jitter, batch_augment=mosaic, seed=1)))
    assert x.shape == (4, 64, 64, 3)
    boxes = y["boxes"].to_tensor(-1.0) if isinstance(y["boxes"], tf.RaggedTensor) else y["boxes"]
    valid = boxes.numpy()[y["classes"].numpy() >= 0] if not isinstance(y["classes"], tf.RaggedTensor) \
        else boxes.numpy()[y["classes"].to_tensor(-1.0).numpy() >= 0]
    assert valid.size > 0
    assert (valid >= -1e-3).all() and (valid <= 64 + 1e-3).all()


def test_non_finite_boxes_are_dropped_and_an_added_label_file_reexports(tmp_path):
    items = draw_items(3)
    root = write_yolo(tmp_path / "yolo", {"train": items})
    with open(os.path.join(root, "labels", "train", "img001.txt"), "a") as f:
        f.write("0 nan 0.5 0.1 0.1\n")
    ds = DatumDataset(root, image_size=(HEIGHT, WIDTH), validation_split=None, verbose=False)
    assert ds.info["splits"]["train"]["boxes_dropped"] == 1
    before = ds.info["splits"]["train"]["objects"]
    # img000 has no label file; adding one must not be served stale.
    with open(os.path.join(root, "labels", "train", "img000.txt"), "w") as f:
        f.write("1 0.5 0.5 0.2 0.2\n")
    again = DatumDataset(root, image_size=(HEIGHT, WIDTH), validation_split=None, verbose=False)
    assert again.info["splits"]["train"]["objects"] == [before[0], before[1] + 1]


def test_a_yolo_image_reached_from_two_splits_is_refused_with_links_followed(tmp_path):
    items = draw_items(6)
    root = write_yolo(tmp_path / "yolo", {"train": items[:4], "val": items[4:]})
    os.symlink("../val", os.path.join(root, "images", "train", "more"))
    with pytest.raises(ValueError, match=r"train/more/img004\.png' \(train\) and .*val/img004\.png' \(val\) are one file"):
        DatumDataset(root, image_size=(8, 8), follow_links=True, cache_dir=tmp_path / "cache",
                     verbose=False).info
    # Without following links, `more/` is not read: nothing is in two splits.
    ds = DatumDataset(root, image_size=(8, 8), cache_dir=tmp_path / "cache", verbose=False)
    assert ds.num_examples == {"train": 4, "val": 2}
