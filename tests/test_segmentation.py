"""Segmentation: VOC palette masks and image/mask folders, resized and augmented together."""

import os

import keras
import keras_cv
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_datum import DatumDataset
from keras_datum.problems.segmentation import VOC_CLASS_NAMES

H, W = 24, 32


def _draw(seed, count=4):
    """[(stem, image pixels, mask indices)]: class 1 or 2 rectangles, 255 borders."""
    rng = np.random.default_rng(seed)
    items = []
    for index in range(count):
        pixels = np.zeros((H, W, 3), np.uint8)
        mask = np.zeros((H, W), np.uint8)
        x1, y1 = rng.integers(0, W // 2), rng.integers(0, H // 2)
        cls = 1 + index % 2
        mask[y1 : y1 + 8, x1 : x1 + 10] = cls
        mask[y1 + 8, x1 : x1 + 10] = 255
        pixels[mask == cls] = 255
        items.append((f"s{index:02d}", pixels, mask))
    return items


def write_voc(root, items):
    os.makedirs(root / "JPEGImages")
    os.makedirs(root / "SegmentationClass")
    palette = [0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * (3 * 252) + [224, 224, 192]
    for stem, pixels, mask in items:
        Image.fromarray(pixels).save(root / "JPEGImages" / f"{stem}.png")
        image = Image.fromarray(mask, mode="P")
        image.putpalette(palette)
        image.save(root / "SegmentationClass" / f"{stem}.png")
    return str(root)


def write_pairs(root, items_by_split, classes=("background", "a", "b")):
    for split, items in items_by_split.items():
        os.makedirs(root / "images" / split)
        os.makedirs(root / "masks" / split)
        for stem, pixels, mask in items:
            Image.fromarray(pixels).save(root / "images" / split / f"{stem}.png")
            Image.fromarray(mask, mode="L").save(root / "masks" / split / f"{stem}.png")
    (root / "classes.txt").write_text("\n".join(classes) + "\n")
    return str(root)


def _pairs(dataset):
    return [(x.numpy(), y.numpy()) for x, y in dataset]


def test_voc_palette_masks_round_trip_as_indices(tmp_path):
    items = _draw(0)
    root = write_voc(tmp_path / "voc", items)
    ds = DatumDataset(root, image_size=(H, W), validation_split=None, batch_size=None, verbose=False)
    assert ds.info["problem"] == "segmentation" and ds.info["layout"] == "voc_segmentation"
    assert ds.class_names == VOC_CLASS_NAMES
    assert ds.info["splits"]["train"]["mask_values"] == [0, 1, 2, 255]
    x_spec, y_spec = ds.train().element_spec
    assert y_spec == tf.TensorSpec((H, W, 1), tf.int32)
    sources = {mask.tobytes() for _, _, mask in items}
    outputs = _pairs(ds.train())
    assert {y[..., 0].astype(np.uint8).tobytes() for _, y in outputs} == sources
    for x, y in outputs:
        np.testing.assert_array_equal(x[..., 0] > 128, np.isin(y[..., 0], [1, 2]))


def test_pairs_with_splits_resize_nearest_and_pad_with_ignore(tmp_path):
    root = write_pairs(tmp_path / "pairs", {"train": _draw(1), "val": _draw(2, 2)})
    ds = DatumDataset(root, image_size=(48, 48), batch_size=None, verbose=False)
    assert ds.info["layout"] == "image_mask_pairs"
    assert ds.class_names == ["background", "a", "b"]
    assert ds.num_examples == {"train": 4, "val": 2}
    for _, y in _pairs(ds.train()):
        assert set(np.unique(y)) <= {0, 1, 2, 255}  # Nearest: no new values.
    padded = DatumDataset(root, image_size=(48, 48), pad_to_aspect_ratio=True, batch_size=None, verbose=False)
    for _, y in _pairs(padded.train()):
        # 24x32 in 48x48: scaled to 36x48, six rows of padding on top and bottom.
        assert (y[:6] == 255).all() and (y[-6:] == 255).all()


@pytest.mark.parametrize("make_flip", [
    lambda: keras_cv.layers.RandomFlip("horizontal"),
    lambda: keras.layers.RandomFlip("horizontal"),
    # Keras's geometric layers move masks with nearest neighbour, by the base
    # class's transform (so, with the image sampled the same way, exactly).
    lambda: keras.layers.RandomRotation(0.25, fill_mode="constant", interpolation="nearest"),
    lambda: keras.layers.RandomZoom(0.3, fill_mode="constant", interpolation="nearest"),
    # Layers in a container are checked one by one (it was refused whole).
    lambda: keras.layers.Pipeline([keras.layers.RandomFlip("horizontal")]),
])
def test_flipped_mask_matches_flipped_image(tmp_path, make_flip):
    root = write_pairs(tmp_path / "pairs", {"train": _draw(3)})
    ds = DatumDataset(root, image_size=(H, W), validation_split=None, batch_size=2, verbose=False)
    plain = _pairs(ds.train(shuffle=False))
    flipped = _pairs(ds.train(shuffle=False, augment=make_flip(), seed=0))
    changed = 0
    for (x0, y0), (x1, y1) in zip(plain, flipped):
        np.testing.assert_array_equal(x1[..., 0] > 128, np.isin(y1[..., 0], [1, 2]))
        changed += int(not np.array_equal(y0, y1))
    assert changed > 0


@pytest.mark.parametrize("make_layer", [
    lambda: keras_cv.layers.RandomCrop(16, 16),
    lambda: keras.layers.Pipeline([keras.layers.RandomFlip(), keras_cv.layers.RandomCrop(16, 16)]),
    lambda: keras.Sequential([keras_cv.layers.RandomCrop(16, 16)]),
])
def test_layer_that_cannot_move_masks_is_refused_before_training(tmp_path, make_layer):
    root = write_pairs(tmp_path / "pairs", {"train": _draw(4)})
    ds = DatumDataset(root, image_size=(H, W), verbose=False)
    with pytest.raises(ValueError, match="cannot transform segmentation masks, so it would misalign") as error:
        ds.train(augment=make_layer())
    # The layers the message suggests instead are accepted.
    assert "keras.layers.RandomFlip, RandomCrop, RandomRotation and RandomZoom; keras_cv.layers.RandomFlip, RandomRotation and RandomTranslation" in str(error.value)
    for layer in (
        keras.layers.RandomFlip(), keras.layers.RandomCrop(8, 8), keras_cv.layers.RandomFlip(),
        keras.layers.RandomRotation(0.2), keras.layers.RandomZoom(0.2),
        keras_cv.layers.RandomRotation(0.1, segmentation_classes=3), keras_cv.layers.RandomTranslation(0.1, 0.1),
    ):
        ds.train(augment=layer)


@pytest.mark.parametrize("make_layer, message", [
    (lambda: keras.layers.RandomCrop(H + 4, W), rf"RandomCrop .* crops {H + 4}x{W}, more than image_size {H}x{W}: it would resize the masks bilinearly"),
    (lambda: keras.layers.CenterCrop(H, W + 1), rf"CenterCrop .* crops {H}x{W + 1}, more than image_size"),
    (lambda: keras.layers.AugMix(value_range=(0, 255)), r"AugMix .* blends the masks of two images by weight"),
])
def test_layers_that_would_make_up_class_ids_are_refused(tmp_path, make_layer, message):
    """Keras's crops resize (bilinearly) when the crop is larger than the
    image, and its mixing layers blend masks: both give ids in no mask."""
    root = write_pairs(tmp_path / "pairs", {"train": _draw(4)})
    ds = DatumDataset(root, image_size=(H, W), verbose=False)
    with pytest.raises(ValueError, match=message):
        ds.train(augment=make_layer())
    with pytest.raises(ValueError, match=r"MixUp .* blends the masks"):
        ds.train(batch_augment=keras.layers.MixUp())
    # A crop within image_size only moves pixels: the ids stay those drawn.
    values = {int(v) for _, y in ds.train(augment=keras.layers.RandomCrop(H - 2, W - 2)) for v in np.unique(y)}
    assert values <= {0, 1, 2, 255}


def test_bad_masks_are_left_out_and_reported(tmp_path):
    items = _draw(5, 5)
    root = write_pairs(tmp_path / "pairs", {"train": items})
    masks = tmp_path / "pairs" / "masks" / "train"
    Image.new("L", (5, 5)).save(masks / "s00.png")  # Wrong size.
    os.remove(masks / "s01.png")
    Image.new("RGB", (W, H)).save(masks / "s02.png")
    # Ids past the 3 classes of classes.txt (255, the ignore label, is fine).
    ids = np.asarray(Image.open(masks / "s03.png")).copy()
    ids[0, :3] = [7, 255, 9]
    Image.fromarray(ids, mode="L").save(masks / "s03.png")
    ds = DatumDataset(root, image_size=(H, W), validation_split=None, verbose=False)
    with pytest.warns(UserWarning, match="4 invalid files"):
        ds.export()
    reasons = sorted(r["reason"] for r in ds.invalid_files)
    assert "is 5x5, the image is 32x24" in reasons[0]
    assert "is a RGB image" in reasons[1]
    assert "s03.png has class ids [7, 9] past the 3 classes listed (0..2, and 255 to ignore)" in reasons[2]
    assert "mask file not found" in reasons[3]
    assert ds.num_examples == {"train": 1}


def test_segmentation_model_fits_with_ignore_class(tmp_path):
    root = write_pairs(tmp_path / "pairs", {"train": _draw(6)})
    ds = DatumDataset(root, image_size=(H, W), validation_split=None, batch_size=2, verbose=False)
    model = keras.Sequential([
        keras.Input((H, W, 3)), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(3, 3, padding="same", activation="softmax"),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(ignore_class=255))
    history = model.fit(ds.train(augment=keras.layers.RandomFlip("horizontal")), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_size_cap_shrinks_the_mask_with_its_image(tmp_path):
    items = [("big", np.zeros((H * 4, W * 4, 3), np.uint8), np.ones((H * 4, W * 4), np.uint8))]
    items[0][2][:, : W * 2] = 2
    root = write_pairs(tmp_path / "pairs", {"train": items})
    ds = DatumDataset(root, image_size=(H, W), max_image_side=2 * W, validation_split=None,
                      batch_size=None, verbose=False)
    assert ds.info["splits"]["train"]["image_sizes"]["width"]["max"] == 2 * W
    (_, y), = _pairs(ds.train())
    assert (y[:, : W // 2 - 1] == 2).all() and (y[:, W // 2 + 1 :] == 1).all()


def test_a_changed_mask_triggers_a_reexport(tmp_path):
    items = _draw(7, 2)
    root = write_pairs(tmp_path / "pairs", {"train": items}, classes=("background", "a", "b", "c"))
    ds = DatumDataset(root, image_size=(H, W), validation_split=None, verbose=False)
    assert ds.info["splits"]["train"]["mask_values"] == [0, 1, 2, 255]
    path = tmp_path / "pairs" / "masks" / "train" / "s00.png"
    Image.fromarray(np.full((H, W), 3, np.uint8), mode="L").save(path)
    os.utime(path, ns=(1, 1))
    again = DatumDataset(root, image_size=(H, W), validation_split=None, verbose=False)
    assert again.info["splits"]["train"]["mask_values"] == [0, 2, 3, 255]


def test_two_images_sharing_a_mask_name_are_refused(tmp_path):
    items = _draw(8, 2)
    root = write_pairs(tmp_path / "pairs", {"train": items})
    Image.fromarray(items[0][1]).save(tmp_path / "pairs" / "images" / "train" / "s00.jpg")
    with pytest.raises(ValueError, match=r"s00\.jpg' and .*s00\.png' share the name 's00'"):
        DatumDataset(root, image_size=(H, W), validation_split=None, verbose=False).export()
    voc = write_voc(tmp_path / "voc", items)
    Image.fromarray(items[1][1]).save(tmp_path / "voc" / "JPEGImages" / "s01.jpg")
    with pytest.raises(ValueError, match=r"s01\.jpg' and .*s01\.png' share the name 's01'"):
        DatumDataset(voc, image_size=(H, W), validation_split=None, verbose=False).export()


def _write_lists(folder, lists):
    os.makedirs(folder, exist_ok=True)
    for name, stems in lists.items():
        (folder / f"{name}.txt").write_text("".join(s + "\n" for s in stems))


def _masks_by_split(ds):
    """{split: sorted mask bytes} of every split the dataset has."""
    splits = {"train": ds.train(), "val": ds.val()}
    return {
        split: sorted(y[..., 0].astype(np.uint8).tobytes() for _, y in _pairs(splits[split]))
        for split in ds.num_examples
    }


@pytest.mark.parametrize("where", ["ImageSets/Segmentation", "ImageSets", "."])
def test_voc_split_lists_are_read_where_they_are(tmp_path, where):
    items = _draw(9, 4)
    root = write_voc(tmp_path / "voc", items)
    _write_lists(tmp_path / "voc" / where, {"train": ["s00", "s02"], "val": ["s01"]})
    ds = DatumDataset(root, image_size=(H, W), batch_size=None, verbose=False)
    mask = {stem: m.tobytes() for stem, _, m in items}
    assert _masks_by_split(ds) == {
        "train": sorted([mask["s00"], mask["s02"]]), "val": [mask["s01"]],
    }


def test_root_split_lists_carve_a_flat_images_and_masks_folder(tmp_path):
    items = _draw(10, 4)
    root = tmp_path / "pairs"
    for sub in ("images", "masks"):
        os.makedirs(root / sub)
    for stem, pixels, mask in items:
        Image.fromarray(pixels).save(root / "images" / f"{stem}.png")
        Image.fromarray(mask, mode="L").save(root / "masks" / f"{stem}.png")
    _write_lists(root, {"train": ["s03", "s01"], "validation": ["s00"]})
    ds = DatumDataset(str(root), image_size=(H, W), batch_size=None, verbose=False)
    mask = {stem: m.tobytes() for stem, _, m in items}
    assert _masks_by_split(ds) == {
        "train": sorted([mask["s03"], mask["s01"]]), "val": [mask["s00"]],
    }
    _write_lists(root, {"train": ["s03", "s09"]})
    with pytest.raises(ValueError, match=r"train\.txt:2: lists 's09', but .*images' has no image"):
        DatumDataset(str(root), image_size=(H, W), batch_size=None, verbose=False).export()


@pytest.mark.parametrize(
    "lists, message",
    [
        ({"train": ["s00", "s01", "s00"]}, r"train\.txt:3 lists 's00', which .*train\.txt:1"),
        ({"train": ["s00", "s01"], "val": ["s02", "s01"]}, r"val\.txt:2 lists 's01', which .*train\.txt:2"),
        ({"train": ["s00"], "val": ["s01"], "validation": ["s02"]}, r"val\.txt' and .*validation\.txt' both list the 'val' split"),
    ],
)
def test_a_voc_split_list_that_repeats_an_example_is_refused(tmp_path, lists, message):
    root = write_voc(tmp_path / "voc", _draw(11, 3))
    _write_lists(tmp_path / "voc" / "ImageSets" / "Segmentation", lists)
    with pytest.raises(ValueError, match=message):
        DatumDataset(root, image_size=(H, W), batch_size=None, verbose=False).export()


def test_images_in_split_folders_need_masks_in_split_folders(tmp_path):
    root = write_pairs(tmp_path / "pairs", {"train": _draw(12, 2), "val": _draw(13, 1)})
    os.rename(tmp_path / "pairs" / "masks" / "val", tmp_path / "pairs" / "masks_val")
    with pytest.raises(ValueError, match=r"images/val' has no .*masks/val'"):
        DatumDataset(root, image_size=(H, W), batch_size=None, verbose=False).export()
    # Split folders without train/: the error says which split is missing.
    root = write_pairs(tmp_path / "no_train", {"val": _draw(12, 1), "test": _draw(13, 1)})
    with pytest.raises(ValueError, match=r"splits \['test', 'val'\] but no 'train' split: add an 'images/train/' folder"):
        DatumDataset(root, image_size=(H, W), batch_size=None, verbose=False).export()


def test_split_folders_beside_other_folders_are_refused(tmp_path):
    root = write_pairs(tmp_path / "pairs", {"train": _draw(14, 2), "val": _draw(15, 1), "extra": _draw(16, 1)})
    # Read as one flat folder, val's images would be trained on.
    with pytest.raises(ValueError, match=r"holds the split folders \['train', 'val'\] beside \['extra'\]"):
        DatumDataset(root, image_size=(H, W), batch_size=None, verbose=False).export()


def test_masks_sharing_a_name_and_lists_beside_split_folders_are_refused(tmp_path):
    items = _draw(17, 2)
    root = write_pairs(tmp_path / "a", {"train": items})
    Image.fromarray(items[0][2], mode="L").save(tmp_path / "a" / "masks" / "train" / "s00.PNG")
    with pytest.raises(ValueError, match=r"share the name 's00'"):
        DatumDataset(root, image_size=(H, W), validation_split=None, verbose=False).export()
    root = write_pairs(tmp_path / "b", {"train": items[:1], "val": items[1:]})
    _write_lists(tmp_path / "b", {"train": ["s01"]})
    with pytest.raises(ValueError, match=r"holds split folders, and .*train\.txt'\] list splits too"):
        DatumDataset(root, image_size=(H, W), verbose=False).export()
