"""TFDS metadata: `tfds.builder_from_directory(cache_dir)` reads what keras_datum wrote."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import make_class_folders, random_image
from detection_data import CLASS_NAMES, HEIGHT, WIDTH, draw_items, write_coco
from helpers import shard_stats
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import cache
from keras_datum import tfds_metadata
from keras_datum import verify


def _examples(builder, split):
    return list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))


def _expected_rgb(path):
    """What an `rgb` decode of the source file gives: alpha dropped, gray repeated."""
    if path.endswith(".jpg"):  # Kept byte for byte; Pillow's IDCT may differ by 1.
        with open(path, "rb") as f:
            return tf.io.decode_jpeg(f.read(), channels=3).numpy()
    return np.asarray(Image.open(path).convert("RGB"))


def _check_splits(builder, ds):
    assert set(builder.info.splits) == set(ds.num_examples)
    assert {s: builder.info.splits[s].num_examples for s in ds.num_examples} == ds.num_examples
    for split, info in ds.info["splits"].items():
        assert builder.info.splits[split].num_shards == len(info["shards"])


def test_classification_round_trip(tmp_path):
    root = make_class_folders(tmp_path / "src", {"cat": 6, "dog": 6}, size=(12, 20))
    # Every kind of stored image must decode to the same RGB pixels.
    rng = np.random.default_rng(1)
    random_image(rng, (9, 7), "L").save(os.path.join(root, "cat", "gray.png"))
    random_image(rng, (8, 8), "RGBA").save(os.path.join(root, "dog", "alpha.png"))
    random_image(rng, (10, 6)).convert("P").save(os.path.join(root, "dog", "palette.png"))
    random_image(rng, (16, 24)).save(os.path.join(root, "cat", "photo.jpg"), quality=90)
    ds = DatumDataset(root, verbose=False)
    ds.export()

    builder = tfds.builder_from_directory(ds.cache_dir)
    _check_splits(builder, ds)
    assert builder.info.features["label"].names == ds.class_names == ["cat", "dog"]
    assert builder.info.supervised_keys == ("image", "label")
    seen = []
    for split in ds.num_examples:
        for example in _examples(builder, split):
            name = example["source/filename"].decode()
            assert ds.class_names[example["label"]] == name.split("/")[0]
            np.testing.assert_array_equal(example["image"], _expected_rgb(os.path.join(root, name)))
            assert (example["image/height"], example["image/width"]) == example["image"].shape[:2]
            seen.append(name)
    assert sorted(seen) == sorted(
        f"{c}/{f}" for c in ("cat", "dog") for f in os.listdir(os.path.join(root, c))
    )
    image, label = next(iter(builder.as_dataset(split="train", as_supervised=True)))
    assert image.dtype == tf.uint8 and image.shape[-1] == 3 and label.dtype == tf.int64


def test_metadata_json_stays_last_and_the_cache_stays_trusted(class_folders, monkeypatch):
    calls = []
    write = tfds_metadata.write_tfds_metadata

    def spy(folder, meta):
        calls.append(os.path.exists(os.path.join(folder, cache.METADATA_FILE)))
        return write(folder, meta)

    monkeypatch.setattr(tfds_metadata, "write_tfds_metadata", spy)
    ds = DatumDataset(class_folders, verbose=False)
    ds.export()
    assert calls == [False]
    files = set(os.listdir(ds.cache_dir))
    assert {"dataset_info.json", "features.json", "label.labels.txt"} <= files
    assert verify.verify_cache(ds.cache_dir) == []
    before = shard_stats(ds)
    again = DatumDataset(class_folders, verbose=False)
    again.export()
    assert calls == [False] and shard_stats(again) == before  # Reused, not rewritten.


def test_detection_round_trip(tmp_path):
    items = {"train": draw_items(6, seed=0), "val": draw_items(3, seed=1)}
    root = write_coco(tmp_path / "coco", items)
    ds = DatumDataset(root, verbose=False)
    ds.export()

    builder = tfds.builder_from_directory(ds.cache_dir)
    _check_splits(builder, ds)
    assert builder.info.features["objects/classes"].feature.names == CLASS_NAMES
    assert builder.info.supervised_keys is None
    scale = np.array([WIDTH, HEIGHT, WIDTH, HEIGHT], np.float32)
    for split, split_items in items.items():
        want = {f"{split}/{stem}.png": (b, c, p) for stem, b, c, p in split_items}
        got = {}
        for example in _examples(builder, split):
            got[example["source/filename"].decode()] = example
        assert sorted(got) == sorted(want)
        for name, (boxes, classes, pixels) in want.items():
            example = got[name]
            np.testing.assert_array_equal(example["image"], pixels)
            assert example["objects/boxes"].shape == (len(boxes), 4)
            np.testing.assert_allclose(
                example["objects/boxes"] * scale, np.reshape(boxes, (-1, 4)), atol=1e-3
            )
            assert example["objects/classes"].tolist() == classes


def test_segmentation_loads_with_masks(tmp_path):
    root = tmp_path / "pairs"
    os.makedirs(root / "images" / "train")
    os.makedirs(root / "masks" / "train")
    rng = np.random.default_rng(0)
    masks = {}
    for index in range(4):
        mask = np.zeros((24, 32), np.uint8)
        mask[4 : 12 + index, 3 : 20] = 1 + index % 2
        masks[f"images/train/s{index}.png"] = mask
        random_image(rng, (24, 32)).save(root / "images" / "train" / f"s{index}.png")
        Image.fromarray(mask, mode="L").save(root / "masks" / "train" / f"s{index}.png")
    (root / "classes.txt").write_text("background\na\nb\n")
    ds = DatumDataset(str(root), validation_split=None, verbose=False)
    ds.export()

    builder = tfds.builder_from_directory(ds.cache_dir)
    _check_splits(builder, ds)
    assert builder.info.supervised_keys == ("image", "mask")
    examples = _examples(builder, "train")
    assert sorted(e["source/filename"].decode() for e in examples) == sorted(masks)
    for example in examples:
        assert example["image"].shape == (24, 32, 3)
        np.testing.assert_array_equal(
            example["mask"][..., 0], masks[example["source/filename"].decode()]
        )


def test_text_loads_with_labels(tmp_path):
    texts = {
        "neg/0.txt": "bad day", "neg/1.txt": "awful",
        "pos/0.txt": "great day", "pos/1.txt": "ça va",
    }
    for name, text in texts.items():
        os.makedirs(tmp_path / "src" / os.path.dirname(name), exist_ok=True)
        (tmp_path / "src" / name).write_text(text, encoding="utf-8")
    ds = DatumDataset(str(tmp_path / "src"), validation_split=None, verbose=False)
    ds.export()

    builder = tfds.builder_from_directory(ds.cache_dir)
    _check_splits(builder, ds)
    assert builder.info.features["label"].names == ["neg", "pos"]
    assert builder.info.supervised_keys == ("text", "label")
    got = {
        e["source/filename"].decode(): (e["text"].decode(), ds.class_names[e["label"]])
        for e in _examples(builder, "train")
    }
    assert got == {name: (text, name.split("/")[0]) for name, text in texts.items()}


@pytest.mark.parametrize("cells, want", [
    (["[0, 2]", "[1]", "[]"], [[0, 2], [1], []]),  # Multi-label: class indices.
    (["[0.5, 1.5]", "[2, 3.5]", "[-1, 0]"], [[0.5, 1.5], [2.0, 3.5], [-1.0, 0.0]]),
])
def test_csv_multi_label_and_regression_labels(tmp_path, cells, want):
    root = tmp_path / "src"
    os.makedirs(root / "train")
    rng = np.random.default_rng(0)
    lines = ["filename,label"]
    for index, cell in enumerate(cells):
        random_image(rng).save(root / "train" / f"{index}.png")
        lines.append(f'{index},"{cell}"')
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    ds = DatumDataset(str(root), validation_split=None, verbose=False)
    ds.export()

    builder = tfds.builder_from_directory(ds.cache_dir)
    got = {
        e["source/filename"].decode(): e["label"].tolist() for e in _examples(builder, "train")
    }
    assert got == {f"train/{i}.png": w for i, w in enumerate(want)}
    if ds.info["label_spec"]["type"] == "multi_label":
        assert builder.info.features["label"].feature.names == ["0", "1", "2"]


def test_split_without_examples_is_left_out(tmp_path):
    make_class_folders(tmp_path / "src" / "train", {"a": 3, "b": 3})
    os.makedirs(tmp_path / "src" / "val" / "a")
    (tmp_path / "src" / "val" / "a" / "bad.png").write_bytes(b"broken")
    with pytest.warns(UserWarning, match="1 invalid files"):
        ds = DatumDataset(str(tmp_path / "src"), verbose=False)
        ds.export()
    assert ds.num_examples == {"train": 6, "val": 0}
    builder = tfds.builder_from_directory(ds.cache_dir)
    assert list(builder.info.splits) == ["train"]
    assert len(_examples(builder, "train")) == 6


def test_class_names_that_a_labels_file_would_change_are_left_out():
    meta = {
        "class_names": ["cat ", "dog"],
        "label_spec": {"type": "class", "num_classes": 2},
        "features": {"label": {"dtype": "int64", "shape": []}},
    }
    features, label_files = tfds_metadata.tfds_features(meta)
    assert label_files == {}
    label = features["featuresDict"]["features"]["label"]
    assert label["classLabel"] == {"numClasses": "2"}


@pytest.mark.parametrize("source, name", [
    ("/data/flowers/", "flowers"),
    ("/data/My Photos-2024", "my_photos_2024"),
    ("/data/2024", "keras_datum_2024"),
    ("/data/___", "keras_datum"),
])
def test_dataset_name(source, name):
    assert tfds_metadata.dataset_name(source) == name


@pytest.mark.parametrize("odd", ["b\rx", "b\nx"])
def test_class_names_a_names_file_would_change_are_left_out(tmp_path, odd):
    """TFDS reads the names one a line (\\r is a line break too), stripped:
    such a name would shift every name after it."""
    root = tmp_path / "src"
    os.makedirs(root / "train")
    rng = np.random.default_rng(0)
    rows = []
    for index, name in enumerate([odd, "cat", "dog"]):
        random_image(rng).save(root / "train" / f"{index}.png")
        rows.append([f"{index}", name])
    with open(root / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows([["filename", "label"], *rows])
    ds = DatumDataset(str(root), validation_split=None, verbose=False)
    assert ds.class_names == sorted([odd, "cat", "dog"])
    builder = tfds.builder_from_directory(ds.cache_dir)
    label = builder.info.features["label"]
    assert label.num_classes == 3
    assert label.names == ["0", "1", "2"]  # TFDS's names for a count alone.
    got = {e["source/filename"].decode(): int(e["label"]) for e in _examples(builder, "train")}
    assert got == {f"train/{i}.png": ds.class_names.index(n) for i, n in enumerate([odd, "cat", "dog"])}
