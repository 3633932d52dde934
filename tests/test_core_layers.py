"""Keras core's preprocessing layers on every image problem type: each one
runs on the data and keeps it aligned, or is refused before any export,
naming the layer (CutMix and AugMix on boxes, label-mixing on masks)."""

import warnings

import keras
import numpy as np
import pytest
from conftest import make_class_folders
from detection_data import draw_items
from detection_data import write_voc
from test_segmentation import _draw as draw_masks
from test_segmentation import write_pairs

from keras_datum import DatumDataset

SIZE = 24
# name -> (make(bounding_box_format or None), per batch)
LAYERS = {
    "RandomFlip": (lambda f: keras.layers.RandomFlip(bounding_box_format=f, seed=1), False),
    "RandomRotation": (lambda f: keras.layers.RandomRotation(0.1, bounding_box_format=f, seed=1),
                       False),
    "RandomTranslation": (
        lambda f: keras.layers.RandomTranslation(0.1, 0.1, bounding_box_format=f, seed=1), False),
    "RandomZoom": (lambda f: keras.layers.RandomZoom(0.2, bounding_box_format=f, seed=1), False),
    "RandomCrop": (lambda f: keras.layers.RandomCrop(SIZE - 4, SIZE - 4, bounding_box_format=f,
                                                     seed=1), False),
    "Resizing": (lambda f: keras.layers.Resizing(SIZE - 8, SIZE - 8, bounding_box_format=f),
                 False),
    "RandAugment": (lambda f: keras.layers.RandAugment(value_range=(0, 255), bounding_box_format=f,
                                                       seed=1), False),
    "RandomErasing": (lambda f: keras.layers.RandomErasing(value_range=(0, 255),
                                                           bounding_box_format=f, seed=1), False),
    "MixUp": (lambda f: keras.layers.MixUp(bounding_box_format=f, seed=1), True),
    "CutMix": (lambda f: keras.layers.CutMix(bounding_box_format=f, seed=1), True),
}
REFUSED = {
    "detection": {
        "MixUp": r"MixUp \(name=.*\) concatenates the boxes and their classes along different "
                 r"axes.*would misalign the boxes",
        "CutMix": r"CutMix \(name=.*\) has no box transform in Keras",
    },
    "segmentation": {
        "MixUp": r"MixUp \(name=.*\) blends the masks of two images by weight",
        "CutMix": r"CutMix \(name=.*\) does not cut the masks as it cuts the images",
    },
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("core_layers")
    common = dict(image_size=(SIZE, SIZE), batch_size=4, verbose=False)
    classes = make_class_folders(tmp / "classes", {"a": 4, "b": 4}, size=(SIZE, SIZE))
    voc = write_voc(tmp / "voc", draw_items(8, boxes_in=lambda i: 1 + i % 2))
    masks = write_pairs(tmp / "pairs", {"train": draw_masks(8, count=8)})
    return {
        "classification": DatumDataset(classes, cache_dir=tmp / "c1", **common),
        "detection": DatumDataset(voc, cache_dir=tmp / "c2", max_boxes=4,
                                  bounding_box_class_key="labels", **common),
        "segmentation": DatumDataset(masks, cache_dir=tmp / "c3", **common),
    }


@pytest.mark.parametrize("problem", ["classification", "detection", "segmentation"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_core_layer_runs_aligned_or_is_refused_by_name(datasets, problem, name):
    ds = datasets[problem]
    make, per_batch = LAYERS[name]
    layer = make("xyxy" if problem == "detection" else None)
    argument = "batch_augment" if per_batch else "augment"
    refusal = REFUSED.get(problem, {}).get(name)
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            ds.train(**{argument: layer})
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MixUp and CutMix switch to one-hot labels.
        x, y = next(iter(ds.train(**{argument: layer})))
    assert x.shape[0] == 4 and np.isfinite(np.asarray(x)).all()
    if problem == "detection":
        boxes, classes = np.asarray(y["boxes"]), np.asarray(y["labels"])
        assert boxes.shape == (4, 4, 4) and classes.shape == (4, 4)
        # Padding is aligned: a box is padding exactly where its class is.
        assert ((classes == -1) == (boxes == -1).all(axis=-1)).all()
    if problem == "segmentation":
        assert y.shape[:3] == x.shape[:3]
        assert set(np.unique(np.asarray(y)).tolist()) <= {0, 1, 2, 255}
