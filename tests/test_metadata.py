"""The typed metadata: a JSON round trip that changes nothing on disk."""

import copy
import json
import os

import pytest
from conftest import make_class_folders

from keras_datum import DatumDataset
from keras_datum import cache
from keras_datum.metadata import Metadata
from keras_datum.metadata import ShardInfo


def _json():
    return {
        "schema_version": 1,
        "problem": "classification",
        "layout": "class_folders",
        "class_names": ["cat", "dog"],
        "label_spec": {"type": "class", "num_classes": 2},
        "features": {"image": {"dtype": "string", "shape": []}},
        "export_options": {"seed": 1},
        "source_fingerprint": {"digest": "abc"},
        "invalid_files": {"count": 1, "report": "invalid_files.json"},
        "splits": {
            "train": {"num_examples": 5, "raw_images": 5, "shards": [
                {"file": "train-00000-of-00002.tfrecord", "num_examples": 5},
                {"file": "train-00001-of-00002.tfrecord", "num_examples": 0},
            ]},
            "val": {"num_examples": 0, "shards": [
                {"file": "val-00000-of-00001.tfrecord", "num_examples": 0},
            ]},
        },
    }


def test_the_json_round_trip_is_exact_and_a_copy():
    data = _json()
    meta = Metadata.from_json(data)
    assert meta.to_json() == data
    out = meta.to_json()
    out["splits"]["train"]["num_examples"] = 99
    assert meta.to_json() == _json()
    assert meta.splits["train"].to_json() == data["splits"]["train"]
    assert ShardInfo.from_json(data["splits"]["train"]["shards"][0]).to_json() == (
        data["splits"]["train"]["shards"][0]
    )


def test_the_derived_counts():
    meta = Metadata.from_json(_json())
    assert meta.num_examples == {"train": 5, "val": 0}
    assert meta.invalid_count == 1 and meta.class_names == ("cat", "dog")
    train = meta.splits["train"]
    assert [s.file for s in train.filled_shards] == ["train-00000-of-00002.tfrecord"]
    assert train.shard_paths("/c") == [os.path.join("/c", "train-00000-of-00002.tfrecord")]
    assert train.stats["raw_images"] == 5
    assert not meta.in_place
    assert Metadata.from_json({**_json(), "datum_export": {}}).in_place
    # An empty val split needs no shard; a train split needs one per worker.
    assert meta.has_shards_for(1) and not meta.has_shards_for(2)


def test_an_unknown_split_is_named_with_the_ones_there_are():
    with pytest.raises(ValueError, match=r"no 'test' split. Its splits are \['train', 'val'\]"):
        Metadata.from_json(_json()).split("test")


def test_an_export_reads_back_as_written(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3})
    ds = DatumDataset(root, image_size=(8, 8), cache_dir=tmp_path / "cache", verbose=False)
    info = ds.info  # The first use exports.
    on_disk = json.loads((tmp_path / "cache" / cache.METADATA_FILE).read_text())
    assert info == on_disk
    meta = Metadata.from_json(copy.deepcopy(on_disk))
    assert meta.to_json() == on_disk
    assert meta.num_examples == ds.num_examples
    assert cache.json_text(meta.to_json()) == cache.json_text(on_disk)
