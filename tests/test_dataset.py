import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_class_folders
from conftest import random_image
from helpers import filenames
from helpers import fit_one_epoch
from helpers import read_split
from helpers import shard_stats
from helpers import unbatched

from keras_datum import DatumDataset


def _keras_reference(root, size=(16, 16)):
    """{pixel bytes: (relative path, label)} and class names from Keras itself."""
    reference = keras.utils.image_dataset_from_directory(
        root, image_size=size, batch_size=None, shuffle=False, verbose=False
    )
    by_pixels = {}
    for (x, y), path in zip(reference, reference.file_paths):
        key = np.asarray(x).astype(np.uint8).tobytes()
        by_pixels[key] = (os.path.relpath(path, root), int(y))
    return reference.class_names, by_pixels


@pytest.mark.parametrize("cache", [True, False])
def test_round_trip_matches_keras_pixels_and_labels(class_folders, cache):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=4, cache=cache, verbose=False)
    class_names, reference = _keras_reference(class_folders)
    assert ds.class_names == class_names == ["bird", "cat", "dog"]

    seen = set()
    for split in ("train", "val"):
        for x, y in unbatched(ds.val() if split == "val" else ds.train(shuffle=False)):
            key = x.astype(np.uint8).tobytes()
            assert np.array_equal(x, np.round(x)), "pixels must be exact integers"
            path, label = reference[key]
            assert int(y) == label
            seen.add(path)
    assert len(seen) == 30 == sum(ds.num_examples.values())


def test_element_spec_and_dtypes(class_folders):
    ds = DatumDataset(class_folders, image_size=(8, 12), batch_size=4, verbose=False)
    x_spec, y_spec = ds.train().element_spec
    assert x_spec == tf.TensorSpec((None, 8, 12, 3), tf.float32)
    assert y_spec == tf.TensorSpec((None,), tf.int32)
    x, _ = next(iter(ds.train()))
    assert 0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 255


@pytest.mark.parametrize(
    "label_mode, spec",
    [
        ("categorical", tf.TensorSpec((None, 3), tf.float32)),
        ("int", tf.TensorSpec((None,), tf.int32)),
    ],
)
def test_label_modes(class_folders, label_mode, spec):
    ds = DatumDataset(class_folders, image_size=(16, 16), label_mode=label_mode, verbose=False)
    assert ds.train().element_spec[1] == spec


def test_label_mode_binary_and_none(tmp_path):
    root = make_class_folders(tmp_path / "two", {"no": 5, "yes": 5})
    ds = DatumDataset(root, image_size=(16, 16), label_mode="binary", verbose=False)
    assert ds.train().element_spec[1] == tf.TensorSpec((None, 1), tf.float32)
    ys = np.concatenate([y for _, y in unbatched(ds.train())])
    assert set(ys.tolist()) == {0.0, 1.0}
    ds_none = DatumDataset(root, image_size=(16, 16), label_mode=None, verbose=False)
    assert ds_none.train().element_spec == tf.TensorSpec((None, 16, 16, 3), tf.float32)


def test_color_modes_and_aspect_options(tmp_path):
    root = make_class_folders(tmp_path / "wide", {"a": 3, "b": 3}, size=(10, 30))
    for kwargs, channels in (
        ({"color_mode": "grayscale"}, 1),
        ({"color_mode": "rgba"}, 4),
        ({"crop_to_aspect_ratio": True}, 3),
        ({"pad_to_aspect_ratio": True}, 3),
    ):
        ds = DatumDataset(root, image_size=(20, 20), verbose=False, **kwargs)
        x, _ = next(iter(ds.train()))
        assert x.shape[1:] == (20, 20, channels)
        # Known before any batch is read, as Keras's: a model needs the channels.
        for split in (ds.train(), ds.val()):
            assert split.element_spec[0].shape.as_list() == [None, 20, 20, channels]
    # Padding a 10x30 image to a square leaves black bands top and bottom.
    ds = DatumDataset(root, image_size=(30, 30), pad_to_aspect_ratio=True, verbose=False)
    x, _ = next(iter(ds.train()))
    assert float(tf.reduce_max(x[:, :5])) == 0.0
    assert float(tf.reduce_max(x[:, 12:18])) > 0.0


def test_crop_to_aspect_ratio_takes_the_centre(tmp_path):
    # A 10x30 image whose middle third is white: cropped to a square, all white.
    os.makedirs(tmp_path / "src" / "a")
    pixels = np.zeros((10, 30, 3), np.uint8)
    pixels[:, 10:20] = 255
    from PIL import Image

    Image.fromarray(pixels).save(tmp_path / "src" / "a" / "x.png")
    ds = DatumDataset(
        str(tmp_path / "src"), image_size=(10, 10), crop_to_aspect_ratio=True,
        validation_split=None, max_image_side=None, verbose=False,
    )
    x, _ = next(iter(ds.train()))
    assert float(tf.reduce_min(x)) == 255.0


def test_validation_carve_is_deterministic_stratified_and_disjoint(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 10, "b": 20, "c": 5})
    first = DatumDataset(root, cache_dir=tmp_path / "c1", seed=7, verbose=False)
    again = DatumDataset(root, cache_dir=tmp_path / "c2", seed=7, verbose=False)
    other = DatumDataset(root, cache_dir=tmp_path / "c3", seed=8, verbose=False)
    train, val = set(filenames(first, "train")), set(filenames(first, "val"))
    assert not train & val
    assert len(train | val) == 35
    assert val == set(filenames(again, "val"))
    assert val != set(filenames(other, "val"))
    per_class = {c: sum(n.startswith(c + "/") for n in val) for c in "abc"}
    assert per_class == {"a": 2, "b": 4, "c": 1}
    carve = first.info["validation_carve"]
    assert carve == {
        "carved": True, "validation_split": 0.2, "seed": 7, "stratified_by_class": True
    }


def test_no_validation_split(class_folders):
    ds = DatumDataset(class_folders, validation_split=None, verbose=False)
    assert ds.num_examples == {"train": 30}
    with pytest.raises(ValueError, match="no 'val' split. Its splits are \\['train'\\]"):
        ds.val()


def test_second_dataset_reuses_cache_without_rewriting(class_folders):
    first = DatumDataset(class_folders, verbose=False)
    first.export()
    before = shard_stats(first)
    second = DatumDataset(class_folders, verbose=False)
    next(iter(second.train()))
    assert second.cache_dir == first.cache_dir
    assert shard_stats(second) == before
    # Read options (image size, batch size) do not trigger an export either.
    third = DatumDataset(class_folders, image_size=(8, 8), batch_size=3, verbose=False)
    next(iter(third.train()))
    assert shard_stats(third) == before


@pytest.mark.parametrize("change", ["add", "remove", "modify"])
def test_source_change_triggers_reexport(class_folders, change):
    first = DatumDataset(class_folders, validation_split=None, verbose=False)
    first.export()
    created = first.info["created"]
    cat = os.path.join(class_folders, "cat")
    rng = np.random.default_rng(99)
    if change == "add":
        random_image(rng).save(os.path.join(cat, "new.png"))
    elif change == "remove":
        os.remove(os.path.join(cat, "000.png"))
    else:
        path = os.path.join(cat, "000.png")
        random_image(rng).save(path)
        os.utime(path, ns=(1, 1))  # A different mtime, whatever the clock's resolution.
    second = DatumDataset(class_folders, validation_split=None, verbose=False)
    expected = {"add": 31, "remove": 29, "modify": 30}[change]
    assert second.num_examples == {"train": expected}
    assert second.info["created"] != created


def test_export_option_change_triggers_reexport(class_folders, tmp_path):
    # One cache_dir for both (by default each carve has its own folder).
    a = DatumDataset(class_folders, validation_split=0.2, cache_dir=tmp_path / "c", verbose=False)
    assert a.num_examples["val"] == 6
    b = DatumDataset(class_folders, validation_split=0.5, cache_dir=tmp_path / "c", verbose=False)
    assert b.num_examples == {"train": 15, "val": 15}
    assert b.info["created"] != a.info["created"]


def test_reexport_never_and_always(class_folders):
    DatumDataset(class_folders, verbose=False).export()
    random_image(np.random.default_rng(1)).save(os.path.join(class_folders, "cat", "x.png"))
    stale = DatumDataset(class_folders, reexport="never", verbose=False)
    assert sum(stale.num_examples.values()) == 30
    always = DatumDataset(class_folders, reexport="always", verbose=False)
    assert sum(always.num_examples.values()) == 31


def test_default_cache_location(class_folders, keras_home):
    ds = DatumDataset(class_folders, verbose=False)
    parent, name = os.path.split(ds.cache_dir)
    assert parent == os.path.join(str(keras_home), "datum")
    assert name.startswith("src-") and len(name) == len("src-") + 10
    ds.export()
    assert os.path.isfile(os.path.join(ds.cache_dir, "metadata.json"))


def test_metadata_records_what_the_issue_asks(class_folders):
    ds = DatumDataset(class_folders, verbose=False)
    ds.export()
    with open(os.path.join(ds.cache_dir, "metadata.json")) as f:
        meta = json.load(f)
    assert meta == ds.info
    assert meta["schema_version"] == 1
    assert meta["keras_datum_version"]
    assert meta["problem"] == "classification"
    assert meta["layout"] == "class_folders"
    assert meta["class_names"] == ["bird", "cat", "dog"]
    assert meta["splits"]["train"]["num_examples"] == 24
    assert [s["num_examples"] for s in meta["splits"]["val"]["shards"]] == [6]
    assert meta["features"]["label"] == {"dtype": "int64", "shape": []}
    assert meta["export_options"]["validation_split"] == 0.2
    assert meta["source_fingerprint"]["num_files"] == 30
    assert len(meta["source_fingerprint"]["digest"]) == 64


def test_shards_mix_all_classes(tmp_path, monkeypatch):
    from keras_datum import export

    monkeypatch.setattr(export, "MIN_EXAMPLES_PER_SHARD", 8)
    root = make_class_folders(tmp_path / "src", {"a": 20, "b": 20, "c": 20})
    ds = DatumDataset(root, validation_split=None, verbose=False)
    shards = ds.info["splits"]["train"]["shards"]
    assert len(shards) == 7
    assert sum(s["num_examples"] for s in shards) == 60
    for shard in shards:
        path = os.path.join(ds.cache_dir, shard["file"])
        labels = {
            tf.train.Example.FromString(r.numpy()).features.feature["label"].int64_list.value[0]
            for r in tf.data.TFRecordDataset(path)
        }
        assert labels == {0, 1, 2}, shard["file"]


@pytest.mark.parametrize("cache", [True, False])
def test_seeded_read_order_is_golden(class_folders, cache):
    def order(seed):
        ds = DatumDataset(class_folders, seed=seed, batch_size=None, cache=cache, verbose=False)
        return [x.numpy().tobytes() for x, _ in ds.train().take(12)]

    assert order(3) == order(3)
    assert order(3) != order(4)


@pytest.mark.parametrize("cache, budget, cached", [
    (True, None, True), ("auto", None, True), ("auto", 100, False), (False, None, False),
])
def test_decoded_cache_serves_later_epochs_from_memory(class_folders, cache, budget, cached):
    ds = DatumDataset(class_folders, image_size=(16, 16), cache=cache, cache_budget=budget, verbose=False)
    train = ds.train()
    first = sorted(x.tobytes() for x, _ in unbatched(train))
    for name in os.listdir(ds.cache_dir):
        if name.startswith("train-"):
            os.remove(os.path.join(ds.cache_dir, name))
    if cached:
        second = sorted(x.tobytes() for x, _ in unbatched(train))
        assert second == first  # Same examples, read from memory.
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"Shard .*train-00000-of-00001.tfrecord.* is missing"):
            list(train)


def test_test_split_and_split_folders(tmp_path):
    root = tmp_path / "src"
    make_class_folders(root / "train", {"a": 6, "b": 6}, seed=1)
    make_class_folders(root / "validation", {"a": 2, "b": 2}, seed=2)
    make_class_folders(root / "test", {"a": 3, "b": 1}, seed=3)
    ds = DatumDataset(str(root), batch_size=2, verbose=False)
    assert ds.info["layout"] == "split_folders"
    assert ds.class_names == ["a", "b"]
    assert ds.num_examples == {"train": 12, "val": 4, "test": 4}
    labels = sorted(int(y) for _, y in unbatched(ds.test()))
    assert labels == [0, 0, 0, 1]


def test_hidden_folders_and_files_are_not_classes(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3})
    make_class_folders(tmp_path / "src", {".ipynb_checkpoints": 2})
    make_class_folders(tmp_path / "src" / "a", {".hidden": 2})
    ds = DatumDataset(root, validation_split=None, verbose=False)
    assert ds.class_names == ["a", "b"]
    assert ds.num_examples == {"train": 6}


@pytest.mark.parametrize("ext", ["png", "jpg"])  # Whole-block and per-example decoding.
@pytest.mark.parametrize("cache", [True, False])
def test_an_empty_split_reads_as_an_empty_dataset(tmp_path, ext, cache):
    # Two files: a validation split of 0.2 rounds to none of them.
    root = make_class_folders(tmp_path / "src", {"a": 1, "b": 1}, ext=ext)
    ds = DatumDataset(root, image_size=(16, 16), batch_size=2, cache=cache, verbose=False)
    assert ds.num_examples == {"train": 2, "val": 0}
    for val in (ds.val(), ds.val(shuffle=True), ds.val(batch_size=None)):
        assert int(val.cardinality()) == 0
        assert list(val) == []
    assert ds.val().element_spec == ds.train().element_spec


def test_single_class_works(tmp_path):
    root = make_class_folders(tmp_path / "src", {"only": 5})
    ds = DatumDataset(root, validation_split=None, verbose=False)
    assert ds.class_names == ["only"]
    assert [int(y) for _, y in unbatched(ds.train())] == [0] * 5


def test_model_fit_runs(class_folders):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=8, verbose=False)
    fit_one_epoch(ds, (16, 16, 3))


def test_train_overrides(class_folders):
    ds = DatumDataset(class_folders, batch_size=4, verbose=False)
    assert next(iter(ds.train(batch_size=5)))[0].shape[0] == 5
    assert len(list(ds.train(batch_size=None))) == 24
    assert len(list(ds.train().take(100))) == 6
    assert len(list(ds.train(repeat=True).take(100))) == 100
    first = [x.numpy().tobytes() for x, _ in ds.val(batch_size=None)]
    assert first == [x.numpy().tobytes() for x, _ in ds.val(batch_size=None)]


def test_read_shards_directly_match_labels_of_folders(class_folders):
    ds = DatumDataset(class_folders, verbose=False)
    for name, label, pixels in read_split(ds, "train") + read_split(ds, "val"):
        assert label == [ds.class_names.index(name.split("/")[0])]
        assert pixels.shape == (16, 16, 3)


def test_export_size_cap_shrinks_big_images_once(tmp_path):
    from PIL import Image

    os.makedirs(tmp_path / "src" / "a")
    Image.fromarray(np.full((300, 400, 3), 200, np.uint8)).save(tmp_path / "src" / "a" / "big.jpg")
    Image.fromarray(np.full((20, 30, 3), 50, np.uint8)).save(tmp_path / "src" / "a" / "small.png")
    root = str(tmp_path / "src")
    ds = DatumDataset(root, image_size=(50, 50), validation_split=None, verbose=False)
    assert ds.info["export_options"]["max_image_side"] == 100
    sizes = {name: pixels.shape for name, _, pixels in read_split(ds, "train")}
    assert sizes == {"a/big.jpg": (75, 100, 3), "a/small.png": (20, 30, 3)}
    created = ds.info["created"]
    # A smaller target is served by the same cache; a larger one re-exports.
    assert DatumDataset(root, image_size=(20, 20), validation_split=None, verbose=False).info["created"] == created
    bigger = DatumDataset(root, image_size=(100, 100), validation_split=None, verbose=False)
    assert bigger.info["created"] != created
    originals = DatumDataset(root, image_size=(50, 50), max_image_side=None, validation_split=None,
                             cache_dir=tmp_path / "orig", verbose=False)
    sizes = {name: pixels.shape for name, _, pixels in read_split(originals, "train")}
    assert sizes["a/big.jpg"] == (300, 400, 3)


def test_the_cap_keeps_a_panoramas_short_side(tmp_path):
    from PIL import Image

    os.makedirs(tmp_path / "src" / "a")
    # 400 x 40 vertical stripes, 5 pixels wide: shrunk to a longer side of 16
    # (twice the target), they would be 2 pixels tall and blurred to grey.
    stripes = np.zeros((40, 400, 3), np.uint8)
    stripes[:, (np.arange(400) // 5) % 2 == 0] = 255
    Image.fromarray(stripes).save(tmp_path / "src" / "a" / "wide.png")
    root = str(tmp_path / "src")
    ds = DatumDataset(root, image_size=(8, 8), validation_split=None, interpolation="nearest",
                      crop_to_aspect_ratio=True, batch_size=None, verbose=False)
    (_, _, stored), = read_split(ds, "train")
    assert stored.shape == (8, 80, 3)  # The shorter side kept at half the cap.
    originals = DatumDataset(root, image_size=(8, 8), validation_split=None, interpolation="nearest",
                             crop_to_aspect_ratio=True, max_image_side=None, batch_size=None,
                             cache_dir=tmp_path / "orig", verbose=False)
    (x, _), = list(ds.train())
    (want, _), = list(originals.train())
    # The stripes survive (shrinking 5x softens their edges): before, every
    # pixel came out 128.
    np.testing.assert_array_equal(x.numpy() > 128, want.numpy() > 128)
    assert float(x.numpy().max() - x.numpy().min()) > 150


def test_an_image_size_sweep_never_exports_over_its_datasets(class_folders):
    small = DatumDataset(class_folders, image_size=(8, 8), batch_size=None, verbose=False)
    val = small.val()
    larger = DatumDataset(class_folders, image_size=(64, 64), batch_size=None, verbose=False)
    larger.export()
    assert larger.cache_dir != small.cache_dir
    assert len(list(val)) == len(list(small.val())) == small.num_examples["val"]
    # A smaller size reads the larger cap's cache: no export of its own.
    smaller = DatumDataset(class_folders, image_size=(16, 16), batch_size=None, verbose=False)
    smaller.export()
    assert smaller.cache_dir == larger.cache_dir
    assert smaller.info["created"] == larger.info["created"]
    # "never" trusts that cache too; a forced export goes to its own folder.
    never = DatumDataset(class_folders, image_size=(16, 16), reexport="never", verbose=False)
    assert never.info["created"] == larger.info["created"]
    forced = smaller.export(force=True)
    assert smaller.cache_dir != larger.cache_dir
    assert forced["export_options"]["max_image_side"] == 32
    again = DatumDataset(class_folders, image_size=(64, 64), verbose=False)
    assert again.cache_dir == larger.cache_dir
    assert again.info["created"] == larger.info["created"]


def test_a_cache_from_before_the_short_side_rule_is_exported_again():
    from keras_datum.store import options_satisfied

    now = {"validation_split": 0.2, "seed": 1, "max_image_side": 512, "min_image_side": 256}
    before = {k: v for k, v in now.items() if k != "min_image_side"}
    assert options_satisfied(now, now)
    assert not options_satisfied(before, now)


def test_a_cap_near_the_target_shrinks_what_is_more_than_25_percent_over(tmp_path):
    from PIL import Image

    os.makedirs(tmp_path / "src" / "a")
    Image.fromarray(np.full((300, 400, 3), 200, np.uint8)).save(tmp_path / "src" / "a" / "big.jpg")
    # 70 pixels: over the cap of 60, but by less than 25%, so kept as it is.
    Image.fromarray(np.full((70, 70, 3), 90, np.uint8)).save(tmp_path / "src" / "a" / "near.jpg")
    # Caches with the automatic cap (100) exist, in the default folders and
    # in a cache_dir: the cap passed is exported all the same, as asked.
    for cache_dir in (None, tmp_path / "cache"):
        auto = DatumDataset(tmp_path / "src", image_size=(50, 50), validation_split=None,
                            cache_dir=cache_dir, verbose=False)
        assert auto.info["export_options"]["max_image_side"] == 100
        ds = DatumDataset(tmp_path / "src", image_size=(50, 50), max_image_side=60,
                          validation_split=None, cache_dir=cache_dir, verbose=False)
        assert ds.info["export_options"]["max_image_side"] == 60
        sizes = {name: pixels.shape for name, _, pixels in read_split(ds, "train")}
        assert sizes == {"a/big.jpg": (45, 60, 3), "a/near.jpg": (70, 70, 3)}
        x, _ = next(iter(ds.train()))
        assert x.shape[1:] == (50, 50, 3)


def test_rgba_reads_jpegs_with_an_opaque_alpha(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 2, "b": 2}, ext="jpg")
    ds = DatumDataset(root, image_size=(16, 16), color_mode="rgba", validation_split=None, verbose=False)
    x, _ = next(iter(ds.train()))
    assert x.shape[-1] == 4 and float(tf.reduce_min(x[..., 3])) == 255.0
    # Known before any batch is read, as Keras's: a Conv2D needs the channels.
    assert ds.train().element_spec[0].shape.as_list() == [None, 16, 16, 4]
    model = keras.Sequential([keras.layers.Conv2D(2, 3), keras.layers.GlobalAveragePooling2D()])
    model.compile("sgd", "mse")
    model.fit(ds.train().map(lambda x, y: (x, tf.zeros([tf.shape(x)[0], 2]))), verbose=0)


def test_a_big_validation_split_never_empties_a_class(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 1, "b": 2, "c": 5})
    ds = DatumDataset(root, validation_split=0.9, verbose=False)
    assert ds.info["splits"]["train"]["class_counts"] == [1, 1, 1]
    assert ds.num_examples == {"train": 3, "val": 5}


_GLOBAL_SEED_RUN = """
import hashlib, sys, warnings
import keras
from keras_datum import DatumDataset
keras.utils.set_random_seed(42)
ds = DatumDataset(sys.argv[1], image_size=(24, 24), batch_size=8, cache=False,
                  cache_dir=sys.argv[2], verbose=False)
rotate = keras.layers.RandomRotation(0.2)
with warnings.catch_warnings():
    # No warning about a seed the script never passed to train().
    warnings.simplefilter("error")
    train = ds.train(augment=[keras.layers.RandomFlip("horizontal"), lambda d: rotate(d)])
for x, y in train.take(4):
    print(hashlib.sha1(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest())
"""


@pytest.mark.slow
def test_keras_set_random_seed_makes_an_unseeded_train_repeat_across_processes(tmp_path):
    """The Keras recipe for a repeatable run: with no `seed`, the read's
    shuffle, its parallel decode and the augmentation follow the global seed."""
    import subprocess
    import sys

    root = make_class_folders(tmp_path / "src", {"a": 40, "b": 40}, size=(48, 40), ext="jpg")
    cache_dir = str(tmp_path / "cache")
    DatumDataset(root, cache_dir=cache_dir, verbose=False).export()
    runs = [
        subprocess.run([sys.executable, "-c", _GLOBAL_SEED_RUN, root, cache_dir],
                       capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split() == runs[1].stdout.split()
    assert len(set(runs[0].stdout.split())) == 4


@pytest.mark.parametrize("cache, batch_size", [(False, 4), (True, 4), (False, None)])
def test_file_paths_name_each_example_in_the_order_it_is_read(tmp_path, cache, batch_size):
    from PIL import Image

    # Noise images of their own size (16x16, read at 16x16: no resize), many
    # shards: the pixels tell which file each example is.
    root = make_class_folders(tmp_path / "src", {"a": 120, "b": 90, "c": 60})
    ds = DatumDataset(root, image_size=(16, 16), batch_size=batch_size, cache=cache,
                      validation_split=0.25, verbose=False)
    for split in ("train", "val"):
        paths = ds.file_paths(split)
        assert len(paths) == len(set(paths)) == ds.num_examples[split]
        read = getattr(ds, split)(shuffle=False)
        images = np.concatenate([x.numpy()[None] if batch_size is None else x.numpy() for x, _ in read])
        labels = np.concatenate([np.atleast_1d(y.numpy()) for _, y in read])
        for path, image, label in zip(paths, images, labels):
            np.testing.assert_array_equal(image, np.asarray(Image.open(path).convert("RGB"), np.float32))
            assert ds.class_names[label] == os.path.basename(os.path.dirname(path))
    assert len(ds.info["splits"]["train"]["shards"]) > 1
    with pytest.raises(ValueError, match=r"no 'test' split"):
        ds.file_paths("test")
