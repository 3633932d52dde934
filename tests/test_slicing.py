"""Split slicing (`ds.split("train[:10%]+val")`), as TFDS spells it."""

import numpy as np
import pytest
from conftest import make_class_folders

from keras_datum import DatumDataset
from keras_datum import record_index
from keras_datum import shard_reader
from keras_datum import slicing

SIZES = {"train": 41, "val": 9}


def _bounds(spec):
    return [(p.split, p.start, p.stop) for p in slicing.parse(spec, SIZES).parts]


@pytest.mark.parametrize("spec,expected", [
    ("train", [("train", 0, 41)]),
    ("train[:10]", [("train", 0, 10)]),
    ("train[10:]", [("train", 10, 41)]),
    ("train[-5:]", [("train", 36, 41)]),
    ("train[:-5]", [("train", 0, 36)]),
    ("train[ 3 : 7 ] + val", [("train", 3, 7), ("val", 0, 9)]),
    # 10% of 41 is 4.1 -> 4; 50% is 20.5 -> 20 (Python's round, as TFDS).
    ("train[:10%]+val", [("train", 0, 4), ("val", 0, 9)]),
    ("train[:50%]", [("train", 0, 20)]),
    ("train[50%:]", [("train", 20, 41)]),
    ("train[-10%:]", [("train", 37, 41)]),
    ("val[33%:67%]", [("val", 3, 6)]),
    ("train[12.5%:25%]", [("train", 5, 10)]),
])
def test_bounds_and_tfds_rounding(spec, expected):
    assert _bounds(spec) == expected


@pytest.mark.parametrize("spec,message", [
    ("tarin[:10%]", r"no 'tarin' split\. Its splits are \['train', 'val'\]"),
    ("train[:101%]", r"101% is beyond 100%"),
    ("train[:42]", r"42 is beyond the split's 41 examples"),
    ("train[-42:]", r"-42 is beyond"),
    ("train[7:7]", r"holds no example"),
    ("train[30%:10%]", r"holds no example"),
    ("train[:5]+train[3:]", r"overlap on 'train' \(examples \[3:5\]\)"),
    ("train+train", r"overlap"),
    ("train[1:2:3]", r"cannot read 'train\[1:2:3\]'"),
    ("train[:1.5]", r"not a whole number"),
    ("", r"must be a string"),
])
def test_bad_specs_are_refused_naming_them(spec, message):
    with pytest.raises(ValueError, match=message):
        slicing.parse(spec, SIZES)


@pytest.mark.parametrize("n", [1, 7, 41, 99, 100, 1001])
def test_percent_slices_never_overlap_and_cover_the_split(n):
    cuts = list(range(0, 101, 5))
    covered = []
    for start, stop in zip(cuts, cuts[1:]):
        try:
            (part,) = slicing.parse(f"train[{start}%:{stop}%]", {"train": n}).parts
        except ValueError:  # An empty slice of a small split.
            continue
        covered.extend(range(part.start, part.stop))
    assert covered == list(range(n))


def _dataset(root, tmp_path, cache=False):
    return DatumDataset(root, image_size=(8, 8), batch_size=4, seed=3, verbose=False,
                        cache_dir=tmp_path / "cache", cache=cache)


@pytest.fixture
def root(tmp_path):
    return make_class_folders(tmp_path / "src", {"a": 14, "b": 13, "c": 13})


@pytest.fixture
def dataset(root, tmp_path):
    return _dataset(root, tmp_path)


def test_file_paths_of_a_slice_follow_the_stored_order(dataset):
    whole = dataset.file_paths("train")
    n = len(whole)
    first, rest = dataset.file_paths("train[:50%]"), dataset.file_paths("train[50%:]")
    assert first + rest == whole
    assert not set(first) & set(rest)
    assert dataset.file_paths("train[-3:]+val") == whole[-3:] + dataset.file_paths("val")
    assert len(dataset.file_paths("train[:10%]")) == round(0.1 * n)


def _images(dataset):
    return np.concatenate([x.numpy() for x, _ in dataset])


@pytest.mark.parametrize("cache", [False, True])
def test_an_unshuffled_slice_reads_those_examples_of_the_split(root, tmp_path, cache):
    dataset = _dataset(root, tmp_path, cache)
    stored = _images(dataset.train(shuffle=False))
    n = len(stored)
    for _ in range(2):  # The second epoch from the decoded cache.
        sliced = dataset.split("train[5:-7]", shuffle=False)
        np.testing.assert_array_equal(_images(sliced), stored[5:n - 7])
    combined = dataset.split("train[-2:]+val", shuffle=False)
    val = _images(dataset.val())
    np.testing.assert_array_equal(_images(combined), np.concatenate([stored[-2:], val]))
    assert combined.num_examples == 2 + len(val)


def test_a_shuffled_slice_gives_each_example_once_an_epoch_in_new_orders(dataset):
    stored = _images(dataset.train(shuffle=False))
    sliced = dataset.split("train[:50%]")
    expected = sorted(map(bytes, stored[: sliced.num_examples]))
    epochs = [_images(sliced) for _ in range(2)]
    for images in epochs:
        assert sorted(map(bytes, images)) == expected
    assert not np.array_equal(epochs[0], epochs[1])
    assert sliced.cardinality().numpy() == -(-sliced.num_examples // 4)


def test_a_slice_needs_batches(dataset):
    with pytest.raises(ValueError, match="pass a `batch_size`"):
        dataset.split("train[:10]", batch_size=None)


def test_workers_share_a_slice_by_example(dataset):
    meta = dataset._metadata()
    segments = slicing.parse("train[3:]+val", meta.num_examples).segments(meta, dataset.cache_dir)
    table = record_index.RecordTable(segments)
    whole = list(table.read(np.arange(table.num_examples))[0])
    shares = [table.shared(index, 3) for index in range(3)]
    read = [list(share.read(np.arange(share.num_examples))[0]) for share in shares]
    assert sorted(sum(read, [])) == sorted(whole)
    assert [share.num_examples for share in shares] == [len(whole[i::3]) for i in range(3)]
    assert read[1] == whole[1::3]
    paths, _ = shard_reader.shards(meta, dataset.cache_dir, "val")
    assert segments[-1].path == paths[-1]
