"""The batch fast path (raw pixels of one size) gives what the per-example path gives."""

import numpy as np
import pytest
from conftest import make_class_folders
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import pipeline

BATCH_DECODER = pipeline._batch_decoder


def _elements(ds, **kwargs):
    return [
        tuple(np.asarray(t) for t in (e if isinstance(e, tuple) else (e,)))
        for e in ds.train(batch_size=None, shuffle=False, **kwargs)
    ]


def _both_paths(ds, monkeypatch, **kwargs):
    used = []

    def spy(*args):
        decoder = BATCH_DECODER(*args)
        used.append(decoder is not None)
        return decoder

    monkeypatch.setattr(pipeline, "_batch_decoder", spy)
    fast = _elements(ds, **kwargs)
    monkeypatch.setattr(pipeline, "_batch_decoder", lambda *args: None)
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
    assert pipeline._batch_decoder(ds.info, "train", ds._read_options) is None
    same = make_class_folders(tmp_path / "same", {"a": 3, "b": 3}, size=(8, 8))
    gray = DatumDataset(same, image_size=(8, 8), color_mode="grayscale",
                        cache_dir=tmp_path / "cache2", verbose=False)
    assert pipeline._batch_decoder(gray.info, "train", gray._read_options) is None
