"""Sources and caches on a TensorFlow file system (`ram://`), through tf.io.gfile."""

import io
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import storage
from keras_datum import store


@pytest.fixture
def ram_root():
    root = f"ram://keras-datum-{uuid.uuid4().hex[:8]}"
    yield root
    if tf.io.gfile.exists(root):
        tf.io.gfile.rmtree(root)


def _write_png(path, pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buffer.getvalue())


def _class_folders(root, counts):
    """{relative path: (label, pixels)} written below `root` in memory."""
    rng = np.random.default_rng(0)
    written = {}
    for label, (name, count) in enumerate(sorted(counts.items())):
        tf.io.gfile.makedirs(f"{root}/{name}")
        for i in range(count):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            _write_png(f"{root}/{name}/{i:02d}.png", pixels)
            written[f"{name}/{i:02d}.png"] = (label, pixels)
    return written


def test_ram_source_and_cache_round_trip(ram_root):
    source, cache_dir = f"{ram_root}/src", f"{ram_root}/cache"
    written = _class_folders(source, {"cat": 6, "dog": 5})
    with tf.io.gfile.GFile(f"{source}/dog/broken.png", "wb") as f:
        f.write(b"not a png")
    with pytest.warns(UserWarning, match="1 invalid files"):
        ds = DatumDataset(
            source, cache_dir=cache_dir, image_size=(8, 8), validation_split=None,
            shuffle=False, verbose=False,
        )
        ds.export()
    assert ds.source == source and ds.cache_dir == cache_dir
    assert ds.class_names == ["cat", "dog"]
    assert ds.num_examples == {"train": 11}
    assert ds.invalid_files[0]["file"] == "dog/broken.png"
    names = set(tf.io.gfile.listdir(cache_dir))
    assert {"metadata.json", "invalid_files.json", "dataset_info.json"} <= names
    # Nothing was written outside the two ram:// folders' parent.
    assert sorted(n.rstrip("/") for n in tf.io.gfile.listdir(ram_root)) == ["cache", "src"]

    batches = list(ds.train(batch_size=None, shuffle=False))
    got = sorted((int(y), np.asarray(x).astype(np.uint8).tobytes()) for x, y in batches)
    want = sorted((label, pixels.tobytes()) for label, pixels in written.values())
    assert got == want

    # A second dataset trusts the cache: nothing is exported again.
    before = storage.stat(f"{cache_dir}/metadata.json")
    again = DatumDataset(source, cache_dir=cache_dir, image_size=(8, 8),
                         validation_split=None, verbose=False)
    assert again.num_examples == {"train": 11}
    assert storage.stat(f"{cache_dir}/metadata.json") == before


def test_ram_reexport_replaces_every_file(ram_root):
    source, cache_dir = f"{ram_root}/src", f"{ram_root}/cache"
    _class_folders(source, {"a": 4, "b": 4})
    options = dict(cache_dir=cache_dir, image_size=(8, 8), verbose=False)
    first = DatumDataset(source, **options)
    first.export()
    assert first.num_examples == {"train": 6, "val": 2}
    _write_png(f"{source}/a/new.png", np.zeros((8, 8, 3), np.uint8))
    second = DatumDataset(source, **options)
    assert second.num_examples == {"train": 7, "val": 2}
    listed = {s["file"] for split in second.info["splits"].values() for s in split["shards"]}
    shards = {n for n in tf.io.gfile.listdir(cache_dir) if n.endswith(".tfrecord")}
    assert shards == listed
    assert [n for n in tf.io.gfile.listdir(ram_root) if ".tmp-" in n] == []


def test_csv_layout_read_through_gfile(ram_root):
    source = f"{ram_root}/csv"
    tf.io.gfile.makedirs(f"{source}/train")
    for i in range(4):
        _write_png(f"{source}/train/{i}.png", np.full((8, 8, 3), i * 40, np.uint8))
    with tf.io.gfile.GFile(f"{source}/train.csv", "w") as f:
        # A byte-order mark, as spreadsheet programs write it.
        f.write("\ufefffilename,label\n0.png,x\n1.png,y\n2.png,x\n3.png,y\n")
    ds = DatumDataset(source, cache_dir=f"{ram_root}/cache", image_size=(8, 8),
                      validation_split=None, verbose=False)
    assert ds.class_names == ["x", "y"]
    labels = sorted(int(y) for _, y in ds.train(batch_size=None, shuffle=False))
    assert labels == [0, 0, 1, 1]


def test_missing_ram_source_is_named(ram_root):
    with pytest.raises(FileNotFoundError, match="Source folder not found"):
        DatumDataset(f"{ram_root}/nothing", verbose=False)


def test_remote_commit_that_died_midway_is_exported_again(ram_root):
    source, cache_dir = f"{ram_root}/src", f"{ram_root}/cache"
    _class_folders(source, {"a": 3, "b": 3})
    DatumDataset(source, cache_dir=cache_dir, verbose=False).export()
    # A commit that died after removing the old metadata: its marker, shards,
    # no metadata.
    tf.io.gfile.remove(f"{cache_dir}/metadata.json")
    with tf.io.gfile.GFile(f"{cache_dir}/{store.COMMIT_MARKER}", "w") as f:
        f.write("")
    again = DatumDataset(source, cache_dir=cache_dir, verbose=False)
    assert again.num_examples["train"] == 4
    assert tf.io.gfile.exists(f"{cache_dir}/metadata.json")
    # A folder holding anything else is still refused.
    tf.io.gfile.makedirs(f"{ram_root}/mine")
    with tf.io.gfile.GFile(f"{ram_root}/mine/notes.txt", "w") as f:
        f.write("my data")
    with pytest.raises(ValueError, match="is not a keras_datum cache"):
        DatumDataset(source, cache_dir=f"{ram_root}/mine", verbose=False).export()
    # So is someone else's TFRecord folder, however cache-like its names.
    with tf.io.gfile.GFile(f"{ram_root}/theirs/train-00000-of-00001.tfrecord", "w") as f:
        f.write("their records")
    with pytest.raises(ValueError, match="is not a keras_datum cache"):
        DatumDataset(source, cache_dir=f"{ram_root}/theirs", verbose=False).export()
    assert tf.io.gfile.exists(f"{ram_root}/theirs/train-00000-of-00001.tfrecord")


def test_paths_on_url_file_systems_keep_their_shape():
    assert storage.normpath("ram:///tmp/x/../y") == "ram:///tmp/y"
    assert storage.normpath("gs://bucket/a/./b/../c") == "gs://bucket/a/c"
    assert storage.normpath("file:///data/voc") == "file:///data/voc"
    assert storage.is_inside("gs://bucket/data/a.png", "gs://bucket/data")
    assert not storage.is_inside("gs://bucket/database/a.png", "gs://bucket/data")
    assert not storage.is_inside("gs://bucket/data/../x.png", "gs://bucket/data")
    # A file system's root stays a URL.
    assert storage.abspath("ram://") == "ram://"
    assert storage.abspath("ram:///") == "ram:///" and storage.abspath("file:///") == "file:///"
    assert storage.abspath("gs://bucket/data/") == "gs://bucket/data"


def test_a_ram_source_beside_a_longer_named_sibling_lists_each_class_once(ram_root):
    # ram:// lists by string prefix: `<root>/dataset/...` shows up in `<root>/data`
    # as `set`, beside the real class folder `set`.
    _class_folders(f"{ram_root}/data", {"set": 3, "other": 3})
    _class_folders(f"{ram_root}/dataset", {"x": 2})
    _class_folders(f"{ram_root}/datas", {"y": 1})  # Would show up as a class `s`.
    assert sorted(storage.listdir(f"{ram_root}/data")) == ["other", "set"]
    ds = DatumDataset(f"{ram_root}/data", cache_dir=f"{ram_root}/cache", validation_split=None, verbose=False)
    assert ds.class_names == ["other", "set"] and ds.num_examples == {"train": 6}
    # TensorFlow's own recursive delete of the root trips on the same prefix.
    tf.io.gfile.rmtree(f"{ram_root}/dataset")
    tf.io.gfile.rmtree(f"{ram_root}/datas")


def test_voc_detection_on_ram(ram_root, tmp_path):
    from detection_data import draw_items
    from detection_data import write_voc

    local = write_voc(str(tmp_path / "voc"), draw_items(6))
    # Copy the drawn VOC folder into memory, then read it from there.
    import os

    for folder, _, names in os.walk(local):
        target = f"{ram_root}/voc/" + os.path.relpath(folder, local)
        tf.io.gfile.makedirs(target)
        for name in names:
            tf.io.gfile.copy(os.path.join(folder, name), f"{target}/{name}")
    ds = DatumDataset(f"{ram_root}/voc", problem="detection", image_size=(40, 60),
                      validation_split=None, cache_dir=f"{ram_root}/cache", verbose=False)
    assert ds.class_names == ["cat", "dog"]
    boxes = sum(int(np.sum(np.asarray(y["labels"]) >= 0))
                for _, y in ds.train(batch_size=None, shuffle=False))
    assert boxes == sum(len(b) for _, b, _, _ in draw_items(6))


def test_read_bytes_local_and_remote(tmp_path, ram_root):
    payload = np.random.default_rng(1).bytes(3 * 2**20 + 7)
    (tmp_path / "big.bin").write_bytes(payload)
    (tmp_path / "empty.bin").write_bytes(b"")
    assert storage.read_bytes(str(tmp_path / "big.bin")) == payload
    assert storage.read_bytes(str(tmp_path / "empty.bin")) == b""
    for size in (1, 4095, 4096, 65536, 65537):  # Around the read sizes.
        (tmp_path / "small.bin").write_bytes(payload[:size])
        assert storage.read_bytes(str(tmp_path / "small.bin")) == payload[:size]
    if os.path.exists("/proc/self/cmdline"):
        # A file whose size says 0 but that has bytes: read to its end.
        with open("/proc/self/cmdline", "rb") as f:
            expected = f.read()
        assert expected and storage.read_bytes("/proc/self/cmdline") == expected
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(str(tmp_path / "missing.bin"))
    with pytest.raises(IsADirectoryError):
        storage.read_bytes(str(tmp_path))
    tf.io.gfile.makedirs(ram_root)
    with tf.io.gfile.GFile(f"{ram_root}/big.bin", "wb") as f:
        f.write(payload)
    assert storage.read_bytes(f"{ram_root}/big.bin") == payload
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{ram_root}/missing.bin")


def test_a_file_on_a_url_file_system_is_read_only_to_the_bound(ram_root, monkeypatch):
    tf.io.gfile.makedirs(ram_root)
    with tf.io.gfile.GFile(f"{ram_root}/ten.bin", "wb") as f:
        f.write(b"0123456789")
    monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", "10")
    assert storage.read_bytes(f"{ram_root}/ten.bin") == b"0123456789"
    monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", "9")
    with pytest.raises(OSError, match=r"ten\.bin'?: 10 bytes, over the bound of 9 bytes"):
        storage.open(f"{ram_root}/ten.bin", "rb")
