"""Datum's CSV layout and label parsing (the classification problem module)."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import make_class_folders
from conftest import random_image
from helpers import read_split
from helpers import unbatched

from keras_datum import DatumDataset
from keras_datum.problems.labels import parse_label_cell


def make_csv_layout(root, rows_by_split, header=("filename", "label"), ext="png"):
    """`rows_by_split`: split folder -> [(stem, *label cells)]; images are drawn."""
    rng = np.random.default_rng(0)
    for split, rows in rows_by_split.items():
        os.makedirs(os.path.join(root, split), exist_ok=True)
        with open(os.path.join(root, f"{split}.csv"), "w") as f:
            f.write(",".join(header) + "\n")
            for stem, *cells in rows:
                random_image(rng).save(os.path.join(root, split, f"{stem}.{ext}"))
                quoted = [f'"{c}"' if "," in str(c) else str(c) for c in cells]
                f.write(",".join([stem, *quoted]) + "\n")
    return str(root)


def test_csv_integer_labels(tmp_path):
    rows = [(f"img{i}", i % 3) for i in range(12)]
    root = make_csv_layout(tmp_path / "src", {"train": rows, "val": rows[:3]})
    ds = DatumDataset(root, image_size=(16, 16), verbose=False)
    assert ds.info["layout"] == "csv"
    assert ds.class_names == ["0", "1", "2"]
    assert ds.num_examples == {"train": 12, "val": 3}
    labels = sorted(int(y) for _, y in unbatched(ds.train()))
    assert labels == sorted(i % 3 for i in range(12))


def test_csv_multi_label(tmp_path):
    rows = [("a", "[0, 2]"), ("b", "[1]"), ("c", "[]"), ("d", "[2,1,0]")]
    root = make_csv_layout(tmp_path / "src", {"train": rows})
    ds = DatumDataset(root, image_size=(16, 16), validation_split=None, verbose=False)
    assert ds.info["label_spec"]["type"] == "multi_label"
    assert ds.train().element_spec[1] == tf.TensorSpec((None, 3), tf.float32)
    got = sorted(tuple(y.tolist()) for _, y in unbatched(ds.train()))
    assert got == sorted([(1, 0, 1), (0, 1, 0), (0, 0, 0), (1, 1, 1)])


def test_csv_regression_and_several_columns(tmp_path):
    rows = [("a", 0.5, 1), ("b", -1.25, 2), ("c", 3, 0.0)]
    root = make_csv_layout(
        tmp_path / "src", {"train": rows}, header=("filename", "x", "y")
    )
    ds = DatumDataset(root, image_size=(16, 16), validation_split=None, verbose=False)
    assert ds.info["label_spec"] == {"type": "regression", "size": 2, "columns": ["x", "y"]}
    got = sorted(tuple(y.tolist()) for _, y in unbatched(ds.train()))
    assert got == sorted([(0.5, 1.0), (-1.25, 2.0), (3.0, 0.0)])


def test_csv_float_list_regression(tmp_path):
    rows = [("a", "[0.5, 1.5]"), ("b", "[2, 3.5]")]
    root = make_csv_layout(tmp_path / "src", {"train": rows})
    ds = DatumDataset(root, image_size=(16, 16), validation_split=None, verbose=False)
    assert ds.train().element_spec[1] == tf.TensorSpec((None, 2), tf.float32)


def test_csv_class_names_and_carve_is_stratified(tmp_path):
    rows = [(f"c{i}", "cat") for i in range(10)] + [(f"d{i}", "dog") for i in range(5)]
    root = make_csv_layout(tmp_path / "src", {"train": rows})
    ds = DatumDataset(root, image_size=(16, 16), label_mode="categorical", verbose=False)
    assert ds.class_names == ["cat", "dog"]
    assert ds.num_examples == {"train": 12, "val": 3}
    val_labels = [tuple(y.tolist()) for _, y in unbatched(ds.val())]
    assert sorted(val_labels) == [(0.0, 1.0), (1.0, 0.0), (1.0, 0.0)]


def test_csv_without_label_columns_gives_images_only(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a",), ("b",)]}, header=("filename",))
    # Images only, with label_mode=None or the default "int", as Keras with labels=None.
    for label_mode in (None, "int"):
        ds = DatumDataset(root, image_size=(16, 16), label_mode=label_mode, validation_split=None, verbose=False)
        assert ds.train().element_spec == tf.TensorSpec((None, 16, 16, 3), tf.float32)
    ds = DatumDataset(root, image_size=(16, 16), validation_split=None, verbose=False)
    assert ds.train().element_spec == tf.TensorSpec((None, 16, 16, 3), tf.float32)
    # One-hot labels asked for where there are none.
    with pytest.raises(ValueError, match=r"`label_mode='categorical'` needs labels, and this dataset has no label columns"):
        DatumDataset(root, image_size=(16, 16), label_mode="categorical", validation_split=None, verbose=False).train()


def test_csv_missing_files_are_named(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 1)]})
    with open(os.path.join(root, "train.csv"), "a") as f:
        f.write("ghost,1\n")
    ds = DatumDataset(root, verbose=False)
    with pytest.raises(ValueError, match="names 1 files missing from .*'ghost'"):
        ds.export()


def test_csv_name_escaping_the_root_is_rejected(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0)]})
    with open(os.path.join(root, "train.csv"), "a") as f:
        f.write("../../etc/passwd,1\n")
    with pytest.raises(ValueError, match="outside the dataset root"):
        DatumDataset(root, verbose=False).export()


def test_csv_without_filename_column(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0)]}, header=("name", "label"))
    with pytest.raises(ValueError, match="needs a header row with a 'filename' column"):
        DatumDataset(root, verbose=False).export()


def test_csv_mixed_label_kinds(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", "[1]")]})
    with pytest.raises(ValueError, match="mixes label kinds"):
        DatumDataset(root, verbose=False).export()


def test_categorical_needs_class_labels(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0.5), ("b", 1.5)]})
    with pytest.raises(ValueError, match="needs class labels, but this dataset's labels are regression"):
        DatumDataset(root, label_mode="categorical", verbose=False).export()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3", 3),
        ("-2.5", -2.5),
        ("1e3", 1000.0),
        ("[1, 2]", [1, 2]),
        ("[ 0.5 ;1 ]", [0.5, 1]),
        ("[]", []),
        ("dog", "dog"),
    ],
)
def test_parse_label_cell(text, expected):
    assert parse_label_cell(text, "f.csv:2") == expected


def test_parse_label_cell_never_evaluates():
    with pytest.raises(ValueError, match=r"f.csv:2: .__import__\(.os.\). in .* is not a number"):
        parse_label_cell("[__import__('os')]", "f.csv:2")


def test_listing_runs_with_the_cyclic_collector_paused_and_restores_it(tmp_path, monkeypatch):
    import gc

    from conftest import make_class_folders

    from keras_datum import problems
    from keras_datum.problems import classification

    make_class_folders(tmp_path / "data", {"a": 2, "b": 2})
    states = []
    find = classification.find_layout

    def spy(root, follow_links=False):
        states.append(gc.isenabled())
        return find(root, follow_links=follow_links)

    monkeypatch.setattr(classification.PROBLEM, "find_layout", spy)
    assert gc.isenabled()
    layout = problems.find_layout(str(tmp_path / "data"))
    assert len(layout.splits["train"]) == 4
    assert states == [False] and gc.isenabled()
    # Restored after an error too, and left off when it was off.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is empty"):
        problems.find_layout(str(tmp_path / "empty"))
    assert gc.isenabled()
    gc.disable()
    try:
        problems.find_layout(str(tmp_path / "data"))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_csv_listing_an_image_twice_is_refused(tmp_path):
    # Listed twice, an image could land in train and in val.
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 1)]})
    with open(os.path.join(root, "train.csv"), "a") as f:
        f.write("a,1\n")
    with pytest.raises(ValueError, match=r"train.csv:4: 'a' is listed again \(first at .*train.csv:2\)"):
        DatumDataset(root, verbose=False).export()


def test_csv_that_is_not_utf8_is_named(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 1)]})
    with open(os.path.join(root, "train.csv"), "ab") as f:
        f.write("café,1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train.csv: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        DatumDataset(root, verbose=False).export()


def _split_folders(root, splits=("train", "val"), classes=("cat", "dog")):
    rng = np.random.default_rng(0)
    for split in splits:
        for name in classes:
            os.makedirs(os.path.join(root, split, name))
            for i in range(3):
                random_image(rng).save(os.path.join(root, split, name, f"{i}.png"))
    return str(root)


def test_a_macos_zips_leftovers_are_not_a_class_or_a_split(tmp_path):
    root = _split_folders(tmp_path / "src")
    # What macOS's zip adds: AppleDouble files under __MACOSX/.
    junk = os.path.join(root, "__MACOSX", "train", "cat")
    os.makedirs(junk)
    with open(os.path.join(junk, "._0.png"), "wb") as f:
        f.write(b"\x00\x05\x16\x07")
    ds = DatumDataset(root, image_size=(16, 16), verbose=False)
    assert ds.info["layout"] == "split_folders"
    assert ds.class_names == ["cat", "dog"]
    assert {s: i["num_examples"] for s, i in ds.info["splits"].items()} == {"train": 6, "val": 6}


def test_split_folders_beside_another_folder_are_refused(tmp_path):
    root = _split_folders(tmp_path / "src")
    os.makedirs(os.path.join(root, "extras", "cat"))
    # Read as class folders, the classes would be 'extras', 'train', 'val'.
    with pytest.raises(ValueError, match=r"looks like split folders .* also has \['extras'\]"):
        DatumDataset(root, verbose=False).export()


def test_classes_named_like_splits_are_still_classes(tmp_path):
    # Pascal VOC's classes include 'train': class folders that hold images.
    root = _split_folders(tmp_path / "src", splits=("",), classes=("bus", "test", "train"))
    ds = DatumDataset(root, image_size=(16, 16), verbose=False)
    assert ds.info["layout"] == "class_folders"
    assert ds.class_names == ["bus", "test", "train"]


def test_csv_errors_name_the_line_an_editor_shows(tmp_path):
    # A byte order mark, CRLF line ends, a blank line and a quoted label that
    # spans two lines: the repeated row starts on line 6.
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 1)]}, header=("filename", "note"))
    text = '\ufefffilename,note\r\na,"two\r\nlines"\r\n\r\nb,x\r\na,y\r\n'
    with open(os.path.join(root, "train.csv"), "w", newline="") as f:
        f.write(text)
    with pytest.raises(ValueError, match=r"train.csv:6: 'a' is listed again \(first at .*train.csv:2\)"):
        DatumDataset(root, verbose=False).export()


def test_images_outside_the_class_folders_are_never_dropped_silently(tmp_path):
    root = _split_folders(tmp_path / "src", splits=("train",))
    rng = np.random.default_rng(1)
    os.makedirs(os.path.join(root, "val"))
    for i in range(2):
        random_image(rng).save(os.path.join(root, "val", f"loose{i}.png"))
    # An empty val split would be served, and none carved from train.
    with pytest.raises(ValueError, match=r"val' holds 2 images outside the class folders .*no other images"):
        DatumDataset(root, verbose=False).export()
    os.makedirs(os.path.join(root, "val", "cat"))
    random_image(rng).save(os.path.join(root, "val", "cat", "0.png"))
    ds = DatumDataset(root, image_size=(16, 16), verbose=False)
    with pytest.warns(UserWarning, match=r"val' holds 2 images outside the class folders .*left out"):
        ds.export()
    assert ds.num_examples == {"train": 6, "val": 1}


def test_a_csv_without_its_split_folder_is_refused(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 1)]})
    with open(os.path.join(root, "val.csv"), "w") as f:
        f.write("filename,label\nc,0\n")
    with pytest.raises(ValueError, match=r"val.csv' has no 'val/' folder beside it"):
        DatumDataset(root, verbose=False).export()


def test_split_folders_without_train_are_refused(tmp_path):
    # Read as class folders, the classes would be 'test' and 'val'.
    root = _split_folders(tmp_path / "src", splits=("val", "test"))
    with pytest.raises(ValueError, match=r"holds only the split folders \['test', 'val'\], each with subfolders"):
        DatumDataset(root, verbose=False).export()


def test_a_class_folder_named_in_another_encoding_is_named(tmp_path):
    # "café" in Latin-1, as an old zip archive may leave it: the metadata and
    # label files are UTF-8, so the folder is named before any work starts.
    root = tmp_path / "src"
    rng = np.random.default_rng(0)
    for folder in (b"caf\xe9", b"tea"):
        path = os.path.join(os.fsencode(root), folder)
        os.makedirs(path)
        random_image(rng, (8, 8)).save(os.path.join(path, b"0.png").decode("utf-8", "surrogateescape"))
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(root, cache_dir=cache_dir, validation_split=None, verbose=False)
    with pytest.raises(ValueError, match=r"The class name b'caf\\xe9' in .* is not valid UTF-8 .*'café'"):
        ds.export()
    assert not cache_dir.exists()


def _real_paths(ds, splits):
    return [os.path.realpath(p) for split in splits for p in ds.file_paths(split)]


def test_a_symlink_loop_between_class_folders_lists_each_image_once_under_the_first_class(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3})
    os.symlink("../b", os.path.join(root, "a", "to_b"))
    os.symlink("../a", os.path.join(root, "b", "to_a"))
    ds = DatumDataset(root, image_size=(8, 8), batch_size=2, follow_links=True, validation_split=0.5,
                      seed=1, cache_dir=tmp_path / "cache", verbose=False)
    real = _real_paths(ds, ["train", "val"])
    images = sorted(os.path.realpath(os.path.join(root, c, f"{i:03d}.png")) for c in "ab" for i in range(3))
    assert sorted(real) == images
    assert sum(ds.num_examples.values()) == 6
    # `a/to_b/` comes before `b/` in Keras's order: b's images are reached first from a.
    labels = [tuple(label) for split in ("train", "val") for _, label, _ in read_split(ds, split)]
    assert labels == [(0,)] * 6
    assert sorted(os.path.relpath(p, root) for s in ("train", "val") for p in ds.file_paths(s)) == [
        "a/000.png", "a/001.png", "a/002.png", "a/to_b/000.png", "a/to_b/001.png", "a/to_b/002.png",
    ]


def test_split_folders_linked_to_each_other_put_each_image_in_one_split(tmp_path):
    root = tmp_path / "src"
    make_class_folders(root / "train", {"a": 2, "b": 2})
    make_class_folders(root / "val", {"a": 2, "b": 2}, seed=1)
    os.symlink("../../val/a", root / "train" / "a" / "more")
    ds = DatumDataset(str(root), image_size=(8, 8), batch_size=2, follow_links=True,
                      cache_dir=tmp_path / "cache", verbose=False)
    assert ds.num_examples == {"train": 6, "val": 2}
    train, val = _real_paths(ds, ["train"]), _real_paths(ds, ["val"])
    assert len(set(train + val)) == 8
    assert sorted(os.path.relpath(p, root) for p in ds.file_paths("val")) == ["val/b/000.png", "val/b/001.png"]


def test_a_csv_image_reached_from_two_splits_is_refused_with_links_followed(tmp_path):
    root = make_csv_layout(tmp_path / "src", {"train": [("a", 0), ("b", 1)], "val": [("c", 0)]})
    os.symlink("../val", os.path.join(root, "train", "more"))
    with open(os.path.join(root, "train.csv"), "a") as f:
        f.write("more/c,1\n")
    with pytest.raises(ValueError, match=r"train/more/c\.png' \(train\) and .*val/c\.png' \(val\) are one file"):
        DatumDataset(root, image_size=(8, 8), follow_links=True, cache_dir=tmp_path / "cache",
                     verbose=False).info


def test_label_mode_none_reads_every_image_below_the_folder_as_keras(tmp_path):
    import keras

    root = make_class_folders(tmp_path / "src", {"a": 4, "b": 3}, size=(8, 8))
    make_class_folders(tmp_path / "src" / "a", {"deeper": 2}, size=(8, 8), seed=2)
    from PIL import Image

    Image.new("RGB", (8, 8), (9, 9, 9)).save(os.path.join(root, "loose.png"))
    ds = DatumDataset(root, image_size=(8, 8), label_mode=None, batch_size=None,
                      validation_split=None, cache_dir=tmp_path / "cache", verbose=False)
    keras_ds = keras.utils.image_dataset_from_directory(
        root, label_mode=None, image_size=(8, 8), batch_size=None, shuffle=False, verbose=False
    )
    assert ds.class_names is None and keras_ds.class_names is None
    ours = sorted(x.numpy().tobytes() for x in ds.train(shuffle=False))
    assert ours == sorted(x.numpy().tobytes() for x in keras_ds)
    assert len(ours) == 4 + 3 + 2 + 1  # The loose image and the nested ones too.
    assert ds.info["layout"] == "unlabelled_files" and ds.info["label_spec"] == {"type": "none"}


def test_label_mode_none_reads_a_flat_folder_with_a_seeded_random_carve(tmp_path):
    root = tmp_path / "flat"
    make_class_folders(tmp_path, {"flat": 10}, size=(8, 8))
    with pytest.raises(ValueError, match="No class folders found"):
        DatumDataset(root, image_size=(8, 8), verbose=False).info
    carved = [
        DatumDataset(root, image_size=(8, 8), label_mode=None, seed=seed,
                     cache_dir=tmp_path / f"cache{seed}-{i}", verbose=False).file_paths("val")
        for seed, i in ((1, 0), (1, 1), (2, 0))
    ]
    assert len(carved[0]) == 2 and carved[0] == carved[1] and carved[0] != carved[2]


def test_label_mode_none_has_its_own_cache_and_the_labelled_one_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3}, size=(8, 8))
    labelled = DatumDataset(root, image_size=(8, 8), verbose=False)
    unlabelled = DatumDataset(root, image_size=(8, 8), label_mode=None, verbose=False)
    assert labelled.cache_dir != unlabelled.cache_dir
    assert labelled.info["layout"] == "class_folders" and labelled.class_names == ["a", "b"]
    assert "unlabelled" not in labelled.info["export_options"]
    assert unlabelled.info["export_options"]["unlabelled"] is True
