"""The batch fast path (raw pixels of one size) gives what the per-example path gives,
and uint8 output gives what the float32 output gives, rounded."""

import numpy as np
import tensorflow as tf
import pytest
from conftest import make_class_folders
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import blocks
from keras_datum import read_plan
from keras_datum import shard_reader
from keras_datum.metadata import Metadata

RAW_LAYOUT = blocks.raw_layout


def _elements(ds, **kwargs):
    return [
        tuple(np.asarray(t) for t in (e if isinstance(e, tuple) else (e,)))
        for e in ds.train(batch_size=None, shuffle=False, **kwargs)
    ]


def _both_paths(ds, monkeypatch, **kwargs):
    used = []

    def spy(*args):
        layout = RAW_LAYOUT(*args)
        used.append(layout is not None)
        return layout

    monkeypatch.setattr(blocks, "raw_layout", spy)
    fast = _elements(ds, **kwargs)
    monkeypatch.setattr(blocks, "raw_layout", lambda *args: None)
    slow = _elements(ds, **kwargs)
    return used, fast, slow


@pytest.mark.parametrize(
    "options",
    [
        {"label_mode": "int"},
        {"label_mode": "categorical", "image_size": (20, 12)},
        {"label_mode": None, "color_mode": "rgba"},
        {"label_mode": "int", "cache": False, "interpolation": "bicubic", "image_size": (7, 9)},
    ],
)
def test_fast_path_matches_the_per_example_path(tmp_path, monkeypatch, options):
    root = make_class_folders(tmp_path / "src", {"a": 7, "b": 6, "c": 5}, size=(10, 14))
    options = {"image_size": (10, 14), **options}
    ds = DatumDataset(root, cache_dir=tmp_path / "cache", verbose=False, **options)
    used, fast, slow = _both_paths(ds, monkeypatch)
    assert used == [True]
    assert len(fast) == len(slow) == ds.num_examples["train"]
    for got, want in zip(fast, slow):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_gray_images_and_regression_labels(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    (tmp_path / "src" / "train").mkdir(parents=True)
    lines = ["filename,label"]
    for i in range(9):
        Image.fromarray(rng.integers(0, 256, (6, 6), dtype=np.uint8), mode="L").save(
            tmp_path / "src" / "train" / f"{i}.png"
        )
        lines.append(f"{i}.png,{i / 4}")
    (tmp_path / "src" / "train.csv").write_text("\n".join(lines) + "\n")
    for color_mode in ("grayscale", "rgb"):
        ds = DatumDataset(tmp_path / "src", image_size=(6, 6), color_mode=color_mode,
                          validation_split=None, cache_dir=tmp_path / "cache", verbose=False)
        used, fast, slow = _both_paths(ds, monkeypatch)
        assert used == [True], color_mode
        for got, want in zip(fast, slow):
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)


def test_mixed_sizes_or_gray_from_rgb_use_the_per_example_path(tmp_path, monkeypatch):
    make_class_folders(tmp_path / "src", {"a": 3}, size=(8, 8))
    make_class_folders(tmp_path / "src", {"b": 3}, size=(9, 8), seed=1)
    ds = DatumDataset(tmp_path / "src", image_size=(8, 8), validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    assert blocks.raw_layout(Metadata.from_json(ds.info), "train", ds.read_options) is None
    same = make_class_folders(tmp_path / "same", {"a": 3, "b": 3}, size=(8, 8))
    gray = DatumDataset(same, image_size=(8, 8), color_mode="grayscale",
                        cache_dir=tmp_path / "cache2", verbose=False)
    assert blocks.raw_layout(Metadata.from_json(gray.info), "train", gray.read_options) is None


def _pairs(batches):
    """Every (pixels, label) pair of a pass, in order, and the batch sizes."""
    pairs, sizes = [], []
    for x, y in batches:
        sizes.append(len(x))
        pairs += [(a.tobytes(), b.tobytes()) for a, b in zip(np.asarray(x), np.asarray(y))]
    return pairs, sizes


def _examples_in_order(ds):
    return [(np.asarray(x).tobytes(), np.asarray(y).tobytes())
            for x, y in ds.train(batch_size=None, shuffle=False)]


def _spy(monkeypatch, name="block_batches"):
    """Notes each call of `blocks.<name>`."""
    used = []
    original = getattr(blocks, name)

    def spy(*args, **kwargs):
        used.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(blocks, name, spy)
    return used


@pytest.mark.parametrize("cache", [True, False])
def test_shuffled_raw_pixels_decode_by_batch_each_example_once_per_epoch(
    tmp_path, monkeypatch, cache
):
    root = make_class_folders(tmp_path / "src", {"a": 30, "b": 25, "c": 20}, size=(8, 8))
    ds = DatumDataset(root, image_size=(8, 8), batch_size=4, cache=cache, validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    # Small blocks and windows, so that a pass has several of each.
    monkeypatch.setattr(shard_reader, "COUNT_BLOCK", 16)
    monkeypatch.setattr(read_plan, "DEFAULT_SHUFFLE_BUFFER", 32)
    used = _spy(monkeypatch, "batch_decode")
    train = ds.train(seed=5)  # A stream (see streams), decoding whole batches.
    assert used == [True]
    want = sorted(_examples_in_order(ds))  # The per-example path.
    assert len(want) == 75
    assert train.cardinality().numpy() == 19
    epochs = []
    for _ in range(3):
        pairs, sizes = _pairs(train)
        assert sizes == [4] * 18 + [3]
        assert sorted(pairs) == want  # Every example once, with its own label.
        epochs.append(pairs)
    assert epochs[0] != epochs[1] != epochs[2]  # Reshuffled each epoch.
    # Examples are shuffled across the split, not block by block: some
    # batch holds examples of two 16-example blocks of the stored order.
    block_of = {pair: i // 16 for i, pair in enumerate(_examples_in_order(ds))}
    batches = [epochs[0][i : i + 4] for i in range(0, 72, 4)]
    assert any(len({block_of[pair] for pair in batch}) > 1 for batch in batches)
    # The same seed gives the same stream, epoch after epoch.
    again = ds.train(seed=5)
    assert [_pairs(again)[0] for _ in range(3)] == epochs


def test_block_path_repeats_with_full_batches_and_no_shuffle_keeps_order(tmp_path, monkeypatch):
    root = make_class_folders(tmp_path / "src", {"a": 6, "b": 5}, size=(8, 8))
    ds = DatumDataset(root, image_size=(8, 8), batch_size=4, validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    used = _spy(monkeypatch)
    ordered, sizes = _pairs(ds.train(shuffle=False))
    assert sizes == [4, 4, 3]
    assert ordered == _examples_in_order(ds)
    repeated, sizes = _pairs(ds.train(repeat=True, shuffle=False).take(11))  # 4 epochs.
    assert sizes == [4] * 11
    assert sorted(repeated) == sorted(ordered * 4)
    assert used == [True, True]


def test_last_step_on_windows_made_ahead_gives_the_batches_of_the_last_step_on_batches(
    tmp_path, monkeypatch
):
    root = make_class_folders(tmp_path / "src", {"a": 30, "b": 25}, size=(8, 8))
    ds = DatumDataset(root, image_size=(8, 8), batch_size=4, validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    monkeypatch.setattr(shard_reader, "COUNT_BLOCK", 16)
    monkeypatch.setattr(read_plan, "DEFAULT_SHUFFLE_BUFFER", 32)
    original, early, ahead = blocks.block_batches, [], []

    def spy(*args, **kwargs):
        early.append(kwargs["then"] is not None)
        ahead.append(kwargs["ahead"])
        return original(*args, **kwargs)

    monkeypatch.setattr(blocks, "block_batches", spy)

    def stream():
        train = ds.train(seed=7, shuffle=False)
        batches = [b for _ in range(2) for b in train]
        assert all(x.dtype == "float32" and y.dtype == "int32" for x, y in batches)
        return [(np.asarray(x).tobytes(), np.asarray(y).tobytes()) for x, y in batches]

    on_windows = stream()
    monkeypatch.setattr(read_plan, "EARLY_FINISH_BYTES", -1)
    assert stream() == on_windows
    assert early == [True, False]
    # Small windows are also made one ahead: the same batches either way.
    assert ahead == [True, False]
    assert len(on_windows) == 2 * 14


@pytest.mark.parametrize("side, half", [(64, False), (80, True)])
def test_half_scale_jpeg_decode_from_two_and_a_half_times_the_target(tmp_path, side, half):
    import tensorflow as tf

    rng = np.random.default_rng(side)
    (tmp_path / "src" / "a").mkdir(parents=True)
    path = tmp_path / "src" / "a" / "0.jpg"
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(path, quality=90)
    ds = DatumDataset(tmp_path / "src", image_size=(32, 32), max_image_side=None, cache=False,
                      validation_split=None, cache_dir=tmp_path / "cache", verbose=False)
    ((x, _),) = ds.train(batch_size=None, shuffle=False)
    data = path.read_bytes()
    want = tf.image.resize(tf.io.decode_jpeg(data, channels=3, ratio=2 if half else 1), (32, 32))
    np.testing.assert_array_equal(np.asarray(x), want.numpy())
    other = tf.image.resize(tf.io.decode_jpeg(data, channels=3, ratio=1 if half else 2), (32, 32))
    assert not np.array_equal(np.asarray(x), other.numpy())


@pytest.mark.parametrize(
    "files, raw",
    [
        # Small PNGs keep raw pixels; the big JPEG needs decoding and halving.
        ({"0.png": (8, 8), "1.png": (8, 8), "2.jpg": (90, 90)}, "some"),
        ({"0.jpg": (40, 40), "1.jpg": (50, 60)}, "none"),  # Never halved.
        ({"0.jpg": (80, 80), "1.jpg": (90, 85)}, "none"),  # Always halved.
        ({"0.png": (8, 8), "1.png": (8, 6)}, "all"),  # Mixed sizes: per example.
    ],
)
@pytest.mark.parametrize("color_mode", ["rgb", "grayscale"])
def test_split_stats_choose_the_decode_path_that_each_image_would(
    tmp_path, monkeypatch, files, raw, color_mode
):
    from keras_datum import images

    rng = np.random.default_rng(len(files))
    (tmp_path / "src" / "a").mkdir(parents=True)
    for name, (height, width) in files.items():
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "src" / "a" / name)
    ds = DatumDataset(tmp_path / "src", image_size=(32, 32), max_image_side=None,
                      color_mode=color_mode, validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    summary = images.stored_images(ds.info["splits"]["train"])
    assert summary["raw"] == raw
    assert (summary["max_height"], summary["max_width"]) == (
        max(h for h, _ in files.values()), max(w for _, w in files.values())
    )
    chosen = _examples_in_order(ds)
    monkeypatch.setattr(images, "stored_images", lambda info: None)
    assert _examples_in_order(ds) == chosen  # The per-image `tf.cond` path.
    assert len(chosen) == len(files)


def _batches(ds, **kwargs):
    x, y = zip(*((np.asarray(x), np.asarray(y)) for x, y in ds.train(shuffle=False, **kwargs)))
    return np.concatenate(x), np.concatenate(y)


@pytest.mark.parametrize(
    "options",
    [
        # Raw-pixel blocks, resized, cached as uint8 / read anew as floats.
        {"image_size": (7, 9), "cache": True},
        {"image_size": (7, 9), "cache": False},
        # Per-example JPEG decode; bicubic can leave [0, 255] and is clipped.
        {"image_size": (12, 10), "cache": False, "interpolation": "bicubic", "ext": "jpg"},
        {"image_size": (12, 10), "cache": True, "ext": "jpg"},
        # Raw pixels at their own size: uint8 from the shard to the batch.
        {"image_size": (16, 16), "cache": False},
    ],
)
def test_uint8_images_are_the_float_images_rounded(tmp_path, options):
    options = dict(options)
    root = make_class_folders(tmp_path / "src", {"a": 7, "b": 6}, ext=options.pop("ext", "png"))
    kwargs = dict(cache_dir=tmp_path / "cache", batch_size=4, verbose=False, **options)
    x_float, y_float = _batches(DatumDataset(root, **kwargs))
    ds = DatumDataset(root, image_dtype="uint8", **kwargs)
    assert ds.train().element_spec[0].dtype == np.uint8
    x, y = _batches(ds)
    assert x.dtype == np.uint8 and x_float.dtype == np.float32
    np.testing.assert_array_equal(y, y_float)
    np.testing.assert_array_equal(x, np.round(np.clip(x_float, 0, 255)).astype(np.uint8))
    if options["cache"]:
        # Cached pixels are integers already: the same values, a quarter of the bytes.
        np.testing.assert_array_equal(x, x_float)


@pytest.mark.parametrize("cache", [True, False])
def test_uint8_images_after_augmentation_are_clipped(tmp_path, cache):
    root = make_class_folders(tmp_path / "src", {"a": 5, "b": 5})
    kwargs = dict(cache_dir=tmp_path / "cache", image_size=(8, 8), batch_size=4, cache=cache, verbose=False)

    def brighter(inputs):
        return {**inputs, "images": inputs["images"] * 1.7 - 20.0}

    x_float, _ = _batches(DatumDataset(root, **kwargs), augment=brighter, batch_augment=brighter)
    assert x_float.min() < 0 and x_float.max() > 255  # The test means something.
    x, _ = _batches(DatumDataset(root, image_dtype="uint8", **kwargs), augment=brighter, batch_augment=brighter)
    assert x.dtype == np.uint8
    np.testing.assert_array_equal(x, np.round(np.clip(x_float, 0, 255)).astype(np.uint8))


@pytest.mark.parametrize("ext", ["png", "jpg"])
@pytest.mark.parametrize("cache", [True, False])
def test_every_variant_of_a_split_knows_its_length(tmp_path, ext, cache):
    # Keras shows epoch progress from it, and `len()` needs it.
    root = make_class_folders(tmp_path / "src", {"a": 9, "b": 8}, size=(8, 8), ext=ext)
    ds = DatumDataset(root, image_size=(8, 8), batch_size=4, cache=cache, validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    assert len(ds.train()) == 5
    assert len(ds.train(augment=lambda e: e)) == 5
    assert len(ds.train(batch_size=None)) == 17
    assert len(ds.train(batch_size=None, shuffle=False)) == 17
    assert ds.train(repeat=True, augment=lambda e: e).cardinality() == tf.data.INFINITE_CARDINALITY
    assert sum(1 for _ in ds.train(augment=lambda e: e)) == 5


def test_a_bad_per_call_seed_is_refused(class_folders):
    ds = DatumDataset(class_folders, verbose=False)
    with pytest.raises(ValueError, match=r"`seed` must be a non-negative integer .* Received: seed=-1"):
        ds.train(seed=-1)
    with pytest.raises(ValueError, match=r"Received: seed='3'"):
        ds.val(seed="3")


@pytest.mark.parametrize("cache", [False, "auto"])
def test_building_pipelines_leaves_nothing_in_the_global_graph(class_folders, cache):
    # A KerasTuner search builds train() and val() for every trial: a
    # function added to TensorFlow's global graph per build (as `scan` at
    # the top level adds its own) stays for good, about 1 MB each.
    ds = DatumDataset(class_folders, image_size=(16, 16), cache=cache, verbose=False)
    ds.export()

    def global_functions():
        return len(tf.compat.v1.get_default_graph().as_graph_def().library.function)

    before = global_functions()
    for _ in range(3):
        for dataset in (ds.train(), ds.val()):
            assert sum(int(y.shape[0]) for _, y in dataset) > 0
    assert global_functions() == before
