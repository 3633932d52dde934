"""The export's two engines (threads, forked processes) write the same shards."""

import os
import re
import warnings

import pytest
import tensorflow as tf
from conftest import make_class_folders

from keras_datum import DatumDataset
from keras_datum import InvalidImageError
from keras_datum import export


def _shard_bytes(ds):
    out = {}
    for name in sorted(os.listdir(ds.cache_dir)):
        if name.endswith(".tfrecord"):
            out[name] = [r.numpy() for r in tf.data.TFRecordDataset(os.path.join(ds.cache_dir, name))]
    return out


def test_process_pool_and_threads_write_identical_shards(tmp_path, monkeypatch):
    root = make_class_folders(tmp_path / "src", {"a": 20, "b": 20, "c": 20})
    (tmp_path / "src" / "a" / "bad.png").write_bytes(b"broken")
    monkeypatch.setattr(export, "MIN_EXAMPLES_PER_SHARD", 8)
    with pytest.warns(UserWarning, match="1 invalid files"):
        threads = DatumDataset(root, cache_dir=tmp_path / "threads", verbose=False)
        threads.export()
    monkeypatch.setattr(export, "PROCESS_POOL_MIN_EXAMPLES", 1)
    with pytest.warns(UserWarning, match="1 invalid files"):
        processes = DatumDataset(root, cache_dir=tmp_path / "processes", verbose=False)
        processes.export()
    assert _shard_bytes(threads) == _shard_bytes(processes)
    assert len(_shard_bytes(processes)) > 2
    assert threads.invalid_files == processes.invalid_files
    assert processes.info["splits"]["train"]["class_counts"] == threads.info["splits"]["train"]["class_counts"]


def test_process_pool_raises_on_invalid_and_cleans_up(tmp_path, monkeypatch):
    root = make_class_folders(tmp_path / "src", {"a": 10, "b": 10})
    (tmp_path / "src" / "b" / "bad.png").write_bytes(b"")
    monkeypatch.setattr(export, "PROCESS_POOL_MIN_EXAMPLES", 1)
    ds = DatumDataset(root, cache_dir=tmp_path / "cache", on_invalid="raise", verbose=False)
    with pytest.raises(InvalidImageError, match=r"bad.png.*empty file"):
        ds.export()
    assert sorted(os.listdir(tmp_path)) == ["cache.lock", "src"]


def test_fingerprint_sizes_give_the_plan_that_measuring_gives(tmp_path):
    from keras_datum import cache
    from keras_datum import problems

    root = make_class_folders(tmp_path / "src", {"a": 30, "b": 30})
    (tmp_path / "src" / "b" / "empty.png").write_bytes(b"")
    layout = problems.find_layout(str(root))
    sizes = {}
    cache.fingerprint(layout, str(root), sizes)
    records = layout.splits["train"]
    assert sizes == {r.path: os.path.getsize(r.path) for r in records}
    assert export.plan_split(records, "train", 3, 4, sizes) == export.plan_split(records, "train", 3, 4)
    assert export._split_bytes(records, sizes) == sum(sizes.values()) > 0
    assert export._split_bytes(records, {}) == export._split_bytes(records, sizes)


def test_a_carve_that_leaves_val_empty_says_so(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 6, "b": 6})
    ds = DatumDataset(root, validation_split=0.01, cache_dir=tmp_path / "cache", verbose=False)
    with pytest.warns(UserWarning, match=r"validation_split=0.01 carves no validation example out of 12"):
        ds.export()
    assert ds.num_examples == {"train": 12, "val": 0}


@pytest.mark.parametrize("entry", ["export", "train", "num_examples", "summary"])
def test_export_warnings_name_the_users_line_whichever_call_exported(tmp_path, entry):
    # The export runs from several depths below the user's call; each warning
    # it gives names the user's file, not keras_datum's.
    root = make_class_folders(tmp_path / "src", {"a": 6, "b": 6})
    (tmp_path / "src" / "a" / "empty.jpg").write_bytes(b"")
    ds = DatumDataset(root, validation_split=0.01, cache_dir=tmp_path / "cache", verbose=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        getattr(ds, entry) if entry == "num_examples" else getattr(ds, entry)()
    ours = [w for w in record if "carves no validation" in str(w.message)
            or "invalid files were left out" in str(w.message)]
    assert len(ours) == 2
    assert [w.filename for w in ours] == [__file__] * 2


def test_a_carve_is_refused_for_a_source_with_its_own_val_split(tmp_path):
    root = tmp_path / "src"
    make_class_folders(root / "train", {"a": 3, "b": 3})
    make_class_folders(root / "val", {"a": 1, "b": 1})
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"has its own validation split, so `validation_split` .* would be ignored.*Received: validation_split=0.5"):
        DatumDataset(root, validation_split=0.5, cache_dir=cache, verbose=False).export()
    assert not cache.exists() or not any(cache.iterdir())
    # The default and None leave the source's own split alone.
    for split in (0.2, None):
        ds = DatumDataset(root, validation_split=split, cache_dir=tmp_path / f"c{split}", verbose=False)
        assert ds.num_examples == {"train": 6, "val": 2}


@pytest.mark.parametrize(
    "hostile, reason",
    [
        ("9" * 5000, r"a number in it is too long to read \(Exceeds the limit \(4300 digits\)"),
        ("[" * 100000 + "]" * 100000, "its arrays or objects are nested too deeply to read"),
    ],
)
def test_a_coco_file_python_cannot_read_is_named_in_the_error(tmp_path, hostile, reason):
    from detection_data import draw_items
    from detection_data import write_coco

    root = write_coco(tmp_path / "src", {"train": draw_items(3)})
    path = os.path.join(root, "annotations", "instances_train.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"iscrowd": 0', f'"iscrowd": {hostile}', 1))
    with pytest.raises(ValueError, match=re.escape(path) + ": " + reason):
        DatumDataset(root, cache_dir=tmp_path / "cache", verbose=False).export()
