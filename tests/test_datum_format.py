"""Reading exports of the original `datum` package in place.

The fixtures are written here exactly as datum writes them (tf.train.Example
with datum's feature names and encodings, `<split>-xxxxx-of-xxxxx.tfrecord`
shards, `shard_info.json`, and `datum_to_type_and_shape_mapping.json` computed
from the last example datum generated), without the datum package.
"""

import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from detection_data import as_xyxy
from detection_data import draw_items
from helpers import fit_one_epoch
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import datum_format
from keras_datum import store

HEIGHT, WIDTH = 20, 30
CLASS_NAMES = ["cat", "dog"]


# --- datum's writer, reproduced ------------------------------------------------


def _feature(value):
    """datum's serializer: a flat numpy array as an int64, float or bytes list."""
    array = np.array(value)
    if array.dtype == np.bool_:
        array = array.astype(int)
    array = array.flatten()
    if np.issubdtype(array.dtype, np.integer):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=array))
    if np.issubdtype(array.dtype, np.floating):
        return tf.train.Feature(float_list=tf.train.FloatList(value=array))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(v).encode() for v in array]))


def _serialize(datum):
    """An image path becomes the file's bytes; everything else is stored as it is."""
    features = {}
    for key, value in datum.items():
        if isinstance(value, str) and value.endswith((".png", ".jpg")):
            with open(value, "rb") as f:
                features[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[f.read()]))
        else:
            features[key] = _feature(value)
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _type_and_shape(value):
    """datum's `item_to_type_and_shape`: an image path gets the image's (h, w, 3)."""
    array = np.array(value)
    shape = list(array.shape)
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return "int", shape
    if np.issubdtype(array.dtype, np.floating):
        return "float", shape
    if isinstance(value, str) and value.endswith((".jpg", ".jpeg", ".png")):
        with Image.open(value) as image:
            return "string", [image.height, image.width, 3]
    return "string", shape


def write_datum_export(out, splits, num_shards=None, seed=0):
    """Writes `{split: [datum dict]}` as datum's TFRecordWriter does, split by split."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, datums in splits.items():
        shards = (num_shards or {}).get(split, 1)
        # datum writes in the order of its hashed keys, not the generator's.
        order = rng.permutation(len(datums))
        serialized = [_serialize(datums[i]) for i in order]
        bounds = [round(len(datums) * (i / shards)) for i in range(1, shards + 1)]
        info, start = {}, 0
        for index, end in enumerate(bounds):
            name = f"{split}-{index:05d}-of-{shards:05d}.tfrecord"
            with tf.io.TFRecordWriter(os.path.join(out, name)) as writer:
                for record in serialized[start:end]:
                    writer.write(record)
            info[name] = end - start
            start = end
        # The mapping is rewritten for every split, from the last generated datum.
        last = datums[-1]
        mapping = {}
        for key, value in last.items():
            kind, shape = _type_and_shape(value)
            mapping[key] = {"type": kind, "shape": shape, "dense": True}
        with open(os.path.join(out, "datum_to_type_and_shape_mapping.json"), "w") as f:
            json.dump(mapping, f)
        shard_info = {split: info}
        info_path = os.path.join(out, "shard_info.json")
        if os.path.isfile(info_path):
            with open(info_path) as f:
                shard_info.update(json.load(f))
        with open(info_path, "w") as f:
            json.dump(shard_info, f)
    return str(out)


# --- Sources ------------------------------------------------------------------


def _noise(rng, path, size=(HEIGHT, WIDTH)):
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return pixels


def classification_export(tmp_path, counts=None):
    """datum's CSV layout (`label` column of ints) as datum exports it.

    Returns (export folder, {pixels bytes: label}).
    """
    counts = counts or {"train": 9, "val": 4}
    rng = np.random.default_rng(1)
    source = tmp_path / "source"
    splits, reference = {}, {}
    for split, count in counts.items():
        os.makedirs(source / split)
        splits[split] = []
        for i in range(count):
            path = str(source / split / f"{i:03d}.png")
            label = i % 3
            reference[_noise(rng, path).tobytes()] = label
            splits[split].append({"image": path, "label": label})
    return write_datum_export(tmp_path / "export", splits, num_shards={"train": 2}), reference


def detection_items(count=6, seed=2):
    """[(stem, absolute xyxy boxes, 0-based classes, pixels)]; the first images
    have 5, 4, 3 boxes and the last one a single box."""
    return draw_items(count, seed, size=(HEIGHT * 2, WIDTH * 2),
                      boxes_in=lambda index: max(1, 5 - index), box_sides=((6, 20), (5, 15)))


def detection_export(tmp_path, items_by_split):
    """VOC images and boxes as datum's DetDatumGenerator yields them."""
    source = tmp_path / "voc" / "JPEGImages"
    os.makedirs(source)
    splits = {}
    for split, items in items_by_split.items():
        splits[split] = []
        for stem, boxes, classes, pixels in items:
            path = str(source / (stem + ".png"))
            Image.fromarray(pixels).save(path)
            height, width = pixels.shape[:2]
            splits[split].append({
                "image": path,
                "xmin": [b[0] / width for b in boxes],
                "xmax": [b[2] / width for b in boxes],
                "ymin": [b[1] / height for b in boxes],
                "ymax": [b[3] / height for b in boxes],
                "pose": ["unspecified"] * len(boxes),
                "labels": [c + 1 for c in classes],  # datum's class_map counts from 1.
                "is_truncated": [False] * len(boxes),
                "labels_difficult": [i % 2 == 0 for i in range(len(boxes))],
            })
    return write_datum_export(tmp_path / "export", splits)


def _snapshot(folder):
    return {
        name: (os.stat(os.path.join(folder, name)).st_mtime_ns, os.path.getsize(os.path.join(folder, name)))
        for name in os.listdir(folder)
    }


# --- Classification -------------------------------------------------------------


def test_classification_round_trip_pixels_labels_and_element_spec(tmp_path):
    export, reference = classification_export(tmp_path)
    ds = DatumDataset.from_tfrecords(
        export, image_size=(HEIGHT, WIDTH), batch_size=4, shuffle=False, verbose=False
    )
    assert ds.info["layout"] == "datum" and ds.info["problem"] == "classification"
    assert list(ds.num_examples.items()) == [("train", 9), ("val", 4)]
    assert ds.class_names == ["0", "1", "2"]  # Counted from the labels.
    x_spec, y_spec = ds.train().element_spec
    assert x_spec == tf.TensorSpec((None, HEIGHT, WIDTH, 3), tf.float32)
    assert y_spec == tf.TensorSpec((None,), tf.int32)
    seen = []
    for split in (ds.train(), ds.val()):
        for x, y in split.unbatch():
            x = x.numpy()
            assert np.array_equal(x, np.round(x))
            key = x.astype(np.uint8).tobytes()
            assert reference[key] == int(y)
            seen.append(key)
    assert sorted(seen) == sorted(reference)
    with pytest.raises(ValueError, match="A datum export stores no file names"):
        ds.file_paths("train")
    categorical = DatumDataset.from_tfrecords(
        export, class_names=["a", "b", "c"], image_size=(8, 8), label_mode="categorical",
        batch_size=None, verbose=False,
    )
    assert categorical.class_names == ["a", "b", "c"]
    x, y = next(iter(categorical.val()))
    assert x.shape == (8, 8, 3) and y.shape == (3,) and float(tf.reduce_sum(y)) == 1.0


def test_uint8_images_from_a_datum_export(tmp_path):
    export, _ = classification_export(tmp_path)
    options = dict(image_size=(HEIGHT, WIDTH), batch_size=4, shuffle=False, verbose=False)
    floats = DatumDataset.from_tfrecords(export, **options)
    ds = DatumDataset.from_tfrecords(export, image_dtype="uint8", **options)
    assert ds.train().element_spec[0].dtype == tf.uint8
    for (x, y), (x_float, y_float) in zip(ds.train(), floats.train()):
        assert x.dtype == tf.uint8
        np.testing.assert_array_equal(x.numpy(), x_float.numpy())  # Integers at their own size.
        np.testing.assert_array_equal(y.numpy(), y_float.numpy())


def test_model_fit_one_epoch(tmp_path):
    export, _ = classification_export(tmp_path)
    ds = DatumDataset.from_tfrecords(export, image_size=(HEIGHT, WIDTH), batch_size=4, verbose=False)
    fit_one_epoch(ds, (HEIGHT, WIDTH, 3))


def test_jpeg_bytes_are_decoded_as_tensorflow_decodes_them(tmp_path):
    rng = np.random.default_rng(3)
    os.makedirs(tmp_path / "src")
    datums = []
    for i in range(3):
        path = str(tmp_path / "src" / f"{i}.jpg")
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path, quality=90)
        datums.append({"image": path, "label": i})
    export = write_datum_export(tmp_path / "export", {"train": datums})
    ds = DatumDataset(export, image_size=(48, 64), batch_size=None, shuffle=False, verbose=False)
    decoded = {}
    for datum in datums:
        with open(datum["image"], "rb") as f:
            decoded[datum["label"]] = tf.io.decode_jpeg(f.read(), channels=3).numpy()
    for x, y in ds.train():
        assert np.array_equal(x.numpy(), decoded[int(y)].astype(np.float32))
    # 48x64 JPEGs into 24x32: resized.
    small = DatumDataset(export, image_size=(24, 32), batch_size=None, shuffle=False, verbose=False)
    x, _ = next(iter(small.train()))
    assert x.shape == (24, 32, 3)


def test_multi_label_and_regression_columns(tmp_path):
    rng = np.random.default_rng(4)
    os.makedirs(tmp_path / "src")
    datums = []
    for i in range(4):
        path = str(tmp_path / "src" / f"{i}.png")
        _noise(rng, path, (8, 8))
        # Label lists of varying length; the last one is the shortest.
        datums.append({"image": path, "tags": [3, 1, 0][: 3 - min(i, 2)], "score": i / 2})
    export = write_datum_export(tmp_path / "multi", {"train": [{"image": d["image"], "tags": d["tags"]} for d in datums]})
    mapping = datum_format.read_mapping(export)
    assert mapping["tags"]["shape"] == [1]
    ds = DatumDataset(export, image_size=(8, 8), batch_size=None, shuffle=False, verbose=False)
    assert ds.info["label_spec"]["type"] == "multi_label" and ds.class_names == ["0", "1", "2", "3"]
    hot = sorted(tuple(y.numpy().tolist()) for _, y in ds.train())
    assert hot == sorted([(1.0, 1.0, 0.0, 1.0), (0.0, 1.0, 0.0, 1.0), (0.0, 0.0, 0.0, 1.0), (0.0, 0.0, 0.0, 1.0)])
    export = write_datum_export(tmp_path / "regression", {"train": [{"image": d["image"], "score": d["score"]} for d in datums]})
    ds = DatumDataset(export, image_size=(8, 8), batch_size=None, verbose=False)
    assert ds.info["label_spec"] == {"type": "regression", "size": 1, "columns": ["score"]}
    assert sorted(float(y[0]) for _, y in ds.train()) == [0.0, 0.5, 1.0, 1.5]


@pytest.mark.parametrize("label_mode", ["int", "categorical"])
def test_class_names_fewer_than_the_labels_fail_instead_of_zero_rows(tmp_path, label_mode):
    export, _ = classification_export(tmp_path)  # Labels 0, 1 and 2.
    ds = DatumDataset.from_tfrecords(
        export, class_names=["a", "b"], image_size=(8, 8), label_mode=label_mode,
        batch_size=None, verbose=False,
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"not below the number of class names \(2\)"):
        for _ in ds.train():
            pass
    with open(os.path.join(export, "labels.txt"), "w") as f:
        f.write("a\nb\n")
    ds = DatumDataset(export, image_size=(8, 8), label_mode=label_mode, batch_size=None, verbose=False)
    assert ds.class_names == ["a", "b"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="Pass class_names= listing every class"):
        for _ in ds.train():
            pass


# --- Detection --------------------------------------------------------------------


def _match(examples, items, fmt, image_size):
    """Each example's boxes and classes are exactly one source item's."""
    remaining = {stem: (np.array(b, np.float32), c) for stem, b, c, _ in items}
    for boxes, classes in examples:
        got = as_xyxy(boxes, fmt, image_size)
        found = next(
            (
                stem for stem, (want, want_classes) in remaining.items()
                if len(want) == len(got) and list(classes) == want_classes
                and np.allclose(got, want, atol=1e-3 * image_size[1])
            ),
            None,
        )
        assert found is not None, (got, classes)
        del remaining[found]
    assert not remaining


@pytest.mark.parametrize("fmt", ["xyxy", "rel_xyxy", "center_xywh"])
def test_detection_varying_box_counts_round_trip(tmp_path, fmt):
    items = detection_items()
    export = detection_export(tmp_path, {"train": items[:5], "val": items[5:]})
    # datum recorded the last example's single box as the shape of every box list.
    mapping = datum_format.read_mapping(export)
    assert mapping["xmin"]["shape"] == [1] and mapping["labels"]["shape"] == [1]
    image_size = (HEIGHT * 2, WIDTH * 2)
    ds = DatumDataset.from_tfrecords(
        export, class_names=CLASS_NAMES, image_size=image_size, bounding_box_format=fmt,
        batch_size=None, shuffle=False, verbose=False,
    )
    assert ds.info["problem"] == "detection" and ds.class_names == CLASS_NAMES
    examples = [(y["boxes"].numpy(), y["labels"].numpy().astype(int)) for _, y in ds.train()]
    assert sorted(len(b) for b, _ in examples) == [1, 2, 3, 4, 5]
    _match(examples, items[:5], fmt, image_size)
    _match([(y["boxes"].numpy(), y["labels"].numpy().astype(int)) for _, y in ds.val()],
           items[5:], fmt, image_size)


def test_detection_class_names_fewer_than_the_labels_fail(tmp_path):
    items = detection_items()
    export = detection_export(tmp_path, {"train": items})
    ds = DatumDataset.from_tfrecords(
        export, class_names=CLASS_NAMES[:1], image_size=(HEIGHT, WIDTH), batch_size=None,
        verbose=False,
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"column \(datum numbers classes from 1\) is not below the number of class names \(1\)"):
        for _ in ds.train():
            pass


def test_detection_dense_max_boxes_and_ragged_batches(tmp_path):
    items = detection_items()
    export = detection_export(tmp_path, {"train": items})
    image_size = (HEIGHT * 2, WIDTH * 2)
    dense = DatumDataset.from_tfrecords(
        export, problem="detection", image_size=image_size, bounding_box_format="rel_xyxy",
        max_boxes=4, batch_size=3, shuffle=False, verbose=False,
    )
    # No class names given: datum's labels 1 and 2 name the classes.
    assert dense.class_names == ["1", "2"]
    x_spec, y_spec = dense.train().element_spec
    assert x_spec == tf.TensorSpec((None, *image_size, 3), tf.float32)
    assert y_spec["boxes"].shape.as_list() == [None, 4, 4]
    assert y_spec["labels"].shape.as_list() == [None, 4]
    rows = []
    for _, y in dense.train():
        for boxes, classes in zip(y["boxes"].numpy(), y["labels"].numpy()):
            real = classes >= 0
            assert np.all(boxes[~real] == -1)
            rows.append((boxes[real], classes[real].astype(int)))
    # Cut to 4 boxes: the first of the 5-box image's boxes are kept.
    cut = [(s, b[:4], c[:4], p) for s, b, c, p in items]
    _match(rows, cut, "rel_xyxy", image_size)

    ragged = DatumDataset(export, image_size=image_size, batch_size=3, shuffle=False, verbose=False)
    counts = []
    for x, y in ragged.train():
        assert isinstance(y["boxes"], tf.RaggedTensor)
        counts += y["boxes"].row_lengths().numpy().tolist()
        assert counts[-len(x):] == y["labels"].row_lengths().numpy().tolist()
    assert sorted(counts) == sorted(len(b) for _, b, _, _ in items)


def test_detection_boxes_follow_the_padding(tmp_path):
    items = detection_items()
    export = detection_export(tmp_path, {"train": items})
    # 40x60 into 90x90: scaled 1.5x to 60x90, 15 rows of padding on top.
    ds = DatumDataset(export, image_size=(90, 90), batch_size=None, shuffle=False, verbose=False)
    scaled = [
        (s, [[b[0] * 1.5, b[1] * 1.5 + 15, b[2] * 1.5, b[3] * 1.5 + 15] for b in boxes], c, None)
        for s, boxes, c, _ in items
    ]
    _match([(y["boxes"].numpy(), y["labels"].numpy().astype(int)) for _, y in ds.train()],
           scaled, "xyxy", (90, 90))


# --- Detection of the format, and reading in place ------------------------------------


def test_datum_dataset_detects_an_export_and_writes_nothing(tmp_path, keras_home):
    export, reference = classification_export(tmp_path)
    before = _snapshot(export)
    ds = DatumDataset(export, image_size=(HEIGHT, WIDTH), batch_size=None, verbose=False)
    for x, y in ds.train():
        assert reference[x.numpy().astype(np.uint8).tobytes()] == int(y)
    assert ds.num_examples == {"train": 9, "val": 4}
    assert ds.cache_dir == os.path.abspath(export)
    assert ds.invalid_files == []
    assert "invalid files left out: 0" in ds.summary(print_fn=None)
    ds.export(force=True)  # Reads the JSON files again; still writes nothing.
    assert _snapshot(export) == before
    assert not os.path.exists(store.default_cache_dir(export))
    assert not os.path.exists(export.rstrip(os.sep) + ".lock")
    assert not os.path.exists(os.path.join(keras_home, "datum"))
    assert set(os.listdir(tmp_path)) <= {"export", "keras_home", "source"}


def test_classes_are_counted_once_per_process(tmp_path, monkeypatch):
    export, _ = classification_export(tmp_path)
    calls = []
    scan = datum_format.scan_labels
    monkeypatch.setattr(datum_format, "scan_labels", lambda *a: calls.append(a) or scan(*a))
    for _ in range(2):
        assert DatumDataset(export, verbose=False).class_names == ["0", "1", "2"]
    assert len(calls) == 1
    with open(os.path.join(export, "labels.txt"), "w") as f:
        f.write("x\ny\nz\n")
    assert DatumDataset(export, verbose=False).class_names == ["x", "y", "z"]
    assert len(calls) == 1


def test_missing_split_uses_the_usual_error(tmp_path):
    export, _ = classification_export(tmp_path, {"train": 4})
    ds = DatumDataset.from_tfrecords(export, verbose=False)
    with pytest.raises(ValueError, match=r"This dataset has no 'val' split. Its splits are \['train'\]"):
        ds.val()


# --- Errors, before any shard is read -----------------------------------------------


@pytest.fixture
def no_reading(monkeypatch):
    """Fails the test if a shard is opened."""

    def fail(*args, **kwargs):
        raise AssertionError("a shard was read")

    monkeypatch.setattr(datum_format, "scan_labels", fail)
    monkeypatch.setattr(tf.data, "TFRecordDataset", fail)


def _corrupt(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_malformed_shard_info(tmp_path, no_reading):
    export, _ = classification_export(tmp_path)
    _corrupt(os.path.join(export, "shard_info.json"), '{"train": {')
    with pytest.raises(ValueError, match=r"shard_info\.json: malformed JSON"):
        DatumDataset.from_tfrecords(export)
    _corrupt(os.path.join(export, "shard_info.json"), '{"train": {"train-00000-of-00001.tfrecord": "many"}}')
    with pytest.raises(ValueError, match=r"shard_info\.json: split 'train' must map shard file names"):
        DatumDataset(export).train()


def test_malformed_mapping(tmp_path, no_reading):
    export, _ = classification_export(tmp_path)
    path = os.path.join(export, "datum_to_type_and_shape_mapping.json")
    _corrupt(path, "[1, 2")
    with pytest.raises(ValueError, match=r"datum_to_type_and_shape_mapping\.json: malformed JSON"):
        DatumDataset.from_tfrecords(export)
    _corrupt(path, '{"image": {"type": "bytes", "shape": []}}')
    with pytest.raises(ValueError, match=r"mapping\.json: feature 'image' needs a type"):
        DatumDataset(export).info


def test_missing_shard(tmp_path, no_reading):
    export, _ = classification_export(tmp_path)
    os.remove(os.path.join(export, "train-00001-of-00002.tfrecord"))
    with pytest.raises(FileNotFoundError, match=r"shard_info\.json lists the shard 'train-00001-of-00002\.tfrecord'"):
        DatumDataset.from_tfrecords(export)


def test_unknown_feature_layouts(tmp_path, no_reading):
    export, _ = classification_export(tmp_path)
    path = os.path.join(export, "datum_to_type_and_shape_mapping.json")
    # datum's segmentation export: the mask is a second image path.
    _corrupt(path, json.dumps({
        "image": {"type": "string", "shape": [20, 30, 3], "dense": True},
        "label": {"type": "string", "shape": [20, 30, 3], "dense": True},
    }))
    with pytest.raises(ValueError, match=r"mapping\.json: unknown feature layout: string features \['label'\]"):
        DatumDataset.from_tfrecords(export)
    _corrupt(path, json.dumps({"text": {"type": "string", "shape": [], "dense": True}}))
    with pytest.raises(ValueError, match=r"mapping\.json: unknown feature layout \['text'\]"):
        DatumDataset(export).info
    _corrupt(path, json.dumps({
        "image": {"type": "string", "shape": [], "dense": True},
        "label": {"type": "int", "shape": [], "dense": True},
    }))
    with pytest.raises(ValueError, match=r"mapping\.json: not a datum VOC detection export.*missing \['xmin'"):
        DatumDataset.from_tfrecords(export, problem="detection")
    with pytest.raises(ValueError, match=r"supports problem='classification' and problem='detection'"):
        DatumDataset.from_tfrecords(export, problem="segmentation")


def test_bad_from_tfrecords_arguments(tmp_path, no_reading):
    export, _ = classification_export(tmp_path)
    with pytest.raises(TypeError, match=r"got options it does not take: \['validation_split'\]"):
        DatumDataset.from_tfrecords(export, validation_split=0.2)
    with pytest.raises(ValueError, match=r"`class_names` must be a list of distinct strings"):
        DatumDataset.from_tfrecords(export, class_names=["a", "a"])
    with pytest.raises(ValueError, match=r"Received: image_size=-5"):
        DatumDataset.from_tfrecords(export, image_size=-5)
    os.makedirs(tmp_path / "images" / "cat")
    with pytest.raises(FileNotFoundError, match=r"is not a datum export: .*shard_info\.json' does not exist"):
        DatumDataset.from_tfrecords(tmp_path / "images")


def test_cli_info_reads_a_datum_export_in_place(tmp_path, capsys):
    from keras_datum import cli

    folder, _ = classification_export(tmp_path)
    before = _snapshot(folder)
    assert cli.main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "datum export, read in place" in out
    assert "train: 9 examples in 2 shards" in out
    assert "val: 4 examples in 1 shards" in out
    assert _snapshot(folder) == before


def test_cli_verify_checks_a_datum_export_in_place(tmp_path, capsys):
    from keras_datum import cli

    folder, _ = classification_export(tmp_path)
    folder = pathlib.Path(folder)
    assert cli.main(["verify", str(folder)]) == 0
    assert f"OK: {folder}: 3 shards, 13 examples, every record intact." in capsys.readouterr().out
    shard = sorted(p for p in os.listdir(folder) if p.startswith("train"))[0]
    with open(folder / shard, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    before = _snapshot(folder)
    assert cli.main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED: {folder / shard}: damaged after" in out
    assert "write it again with datum" in out
    os.remove(folder / shard)
    assert cli.main(["verify", str(folder)]) == 1
    assert shard in capsys.readouterr().out
    assert sorted(os.listdir(folder)) == sorted(n for n in before if n != shard)
    # A sound export of features keras_datum does not read (tabular) is
    # still verified: only the shards and shard_info.json are checked.
    tabular = write_datum_export(tmp_path / "tabular", {"train": [
        {"features": np.arange(3, dtype=np.float32) + i, "target": i} for i in range(4)
    ]})
    assert cli.main(["verify", tabular]) == 0
    assert f"OK: {tabular}: 1 shards, 4 examples" in capsys.readouterr().out
