"""The option objects, built and checked with no disk work."""

import dataclasses
import inspect

import pytest

from keras_datum import DatumDataset
from keras_datum import augment
from keras_datum import config
from keras_datum import problems


def test_the_signature_and_the_config_defaults_agree():
    params = inspect.signature(DatumDataset).parameters
    signature = {n: p.default for n, p in params.items() if n != "source"}
    assert signature == dict(config.DEFAULTS)


def test_configure_builds_frozen_options_from_the_arguments():
    built = config.configure(image_size=[64, 48], batch_size=8, seed=3, max_boxes=5,
                             bucket_boundaries=[4, 8], max_image_side=None)
    assert built.read.image_size == (64, 48)
    assert built.read.bucket_boundaries == (4, 8)
    assert built.runtime.batch_size == 8 and built.runtime.seed == 3
    assert built.export.seed == 3 and built.export.max_image_side is None
    assert built.exact_cap and not built.carve_asked
    assert built.problem_options == {"image_size": (64, 48), "max_boxes": 5,
                                     "bucket_boundaries": [4, 8], "max_image_side": None}
    for options in (built, built.export, built.read, built.runtime):
        with pytest.raises(dataclasses.FrozenInstanceError):
            options.seed = 1


def test_the_export_options_at_the_defaults_name_no_variant():
    assert config.configure().export.carve_variant() == {}
    assert config.configure(image_size=(224, 224)).export.carve_variant() == {
        "max_image_side": 448
    }
    assert config.configure(validation_split=0.1).carve_asked


def test_the_export_options_json_keeps_its_keys_in_order():
    assert list(config.ExportOptions().to_json()) == [
        "validation_split", "seed", "follow_links", "problem", "max_image_side",
        "min_image_side", "min_shards", "validation",
    ]


def test_each_problem_owns_its_options():
    assert problems.PROBLEM_OPTIONS["max_boxes"] == ("detection",)
    assert problems.PROBLEM_OPTIONS["bucket_boundaries"] == ("text",)
    assert problems.PROBLEM_OPTIONS["image_size"] == (
        "detection", "segmentation", "classification"
    )


def test_the_problem_fills_in_its_read_defaults():
    built = config.configure()
    assert built.read.pad_to_aspect_ratio is None
    assert config.read_options_for(built, "detection").pad_to_aspect_ratio is True
    assert config.read_options_for(built, "classification").pad_to_aspect_ratio is False
    unpadded = config.configure(pad_to_aspect_ratio=False)
    assert config.read_options_for(unpadded, "detection").pad_to_aspect_ratio is False
    assert built.read.pad_to_aspect_ratio is None  # A new object, the old one as it was.


def test_an_option_of_another_problem_is_refused_when_the_problem_is_known():
    built = config.configure(max_boxes=4)
    with pytest.raises(ValueError, match=r"`max_boxes` applies to detection datasets, and "
                       r"this one is classification.*Received: max_boxes=4"):
        config.read_options_for(built, "classification")
    with pytest.raises(ValueError, match="applies to detection, segmentation and "
                       "classification datasets, and this one is text"):
        config.read_options_for(config.configure(color_mode="grayscale"), "text")


def test_a_label_mixing_switch_makes_new_read_options():
    class MixUp:
        def __call__(self, inputs):
            return inputs

    read = config.ReadOptions()
    mixing = augment.resolve(None, MixUp(), None, None)
    with pytest.warns(UserWarning, match="switched from 'int' to 'categorical'"):
        switched, built = augment.read_options_for_split(
            read, frozenset(), "train", mixing, {"type": "class"}
        )
    assert switched.label_mode == "categorical" and read.label_mode == "int"
    assert built == {"train"}
    same, built = augment.read_options_for_split(read, {"val"}, "train", (None, None),
                                                 {"type": "class"})
    assert same is read and built == {"val", "train"}


def test_keras_spellings_of_the_image_size_and_the_interpolation(tmp_path):
    from conftest import make_class_folders

    built = config.configure(image_size=18, interpolation="BILINEAR")
    assert built.read.image_size == (18, 18) and built.read.interpolation == "bilinear"
    assert built.export.max_image_side == 36
    with pytest.raises(ValueError, match=r"Received: interpolation='Cubic'"):
        config.configure(interpolation="Cubic")
    root = make_class_folders(tmp_path / "src", {"a": 2, "b": 2})
    ds = DatumDataset(root, image_size=18, interpolation="Nearest", batch_size=4,
                      validation_split=None, cache_dir=tmp_path / "cache", verbose=False)
    images, _ = next(iter(ds.train()))
    assert images.shape == (4, 18, 18, 3)
