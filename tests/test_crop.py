"""The fused random-resized-crop: torchvision's window distribution, the
pixels, masks and boxes of a window, its seeding, and its refusals."""

import io
import math
import os
import random

import detection_data
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import crop
from keras_datum import positions
from keras_datum import streams

DEFAULT = crop.RandomResizedCrop()


def _torchvision_window(rng, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's `RandomResizedCrop.get_params`, as its documentation
    and source describe it, in plain Python: the reference."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _ours(height, width, count, crop_options=DEFAULT):
    seeds = tf.stack([tf.zeros([count], tf.int64), tf.range(count, dtype=tf.int64)], axis=1)
    windows = tf.data.Dataset.from_tensor_slices(seeds).map(
        lambda seed: crop.window(height, width, crop_options, seed)
    ).batch(count)
    return next(iter(windows)).numpy()


def _ks(a, b):
    """The two-sample Kolmogorov-Smirnov statistic."""
    values = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return np.abs(cdf_a - cdf_b).max()


def _features(windows, height, width):
    top, left, h, w = (windows[:, i].astype(float) for i in range(4))
    return {
        "area": h * w / (height * width),
        "log ratio": np.log(w / h),
        "top": top / np.maximum(height - h, 1),
        "left": left / np.maximum(width - w, 1),
    }


@pytest.mark.parametrize("height, width", [(375, 500), (100, 1000), (64, 64)])
def test_windows_follow_torchvision_distribution(height, width):
    count = 4000
    rng = random.Random(0)
    reference = np.array([_torchvision_window(rng, height, width) for _ in range(count)])
    ours = _ours(height, width, count)
    assert (ours[:, 0] >= 0).all() and (ours[:, 1] >= 0).all()
    assert (ours[:, 0] + ours[:, 2] <= height).all() and (ours[:, 1] + ours[:, 3] <= width).all()
    # Two samples of 4,000 from one distribution: D > 0.044 has p < 0.1%.
    limit = 1.95 * math.sqrt(2 / count)
    for name, values in _features(ours, height, width).items():
        expected = _features(reference, height, width)[name]
        assert _ks(values, expected) < limit, name
    # How often the 10 attempts all miss (the centre fallback) agrees too.
    fallback = (ours[:, 2] == height) | (ours[:, 3] == width)
    reference_fallback = (reference[:, 2] == height) | (reference[:, 3] == width)
    assert abs(fallback.mean() - reference_fallback.mean()) < 0.03


def test_the_area_and_ratio_stay_within_their_bounds():
    options = crop.RandomResizedCrop(scale=(0.25, 0.5), ratio=(1.0, 2.0))
    windows = _ours(600, 600, 2000, options)
    area = windows[:, 2] * windows[:, 3] / 600**2
    ratio = windows[:, 3] / windows[:, 2]
    # Rounding to whole pixels moves them by a pixel's worth.
    assert area.min() > 0.245 and area.max() < 0.505
    assert ratio.min() > 0.99 and ratio.max() < 2.01
    assert area.max() - area.min() > 0.2 and ratio.max() - ratio.min() > 0.8


def test_a_window_too_thin_for_every_attempt_falls_back_to_the_centre():
    # 10 x 1000: no window of area >= 8% and ratio <= 4/3 fits.
    windows = _ours(10, 1000, 50)
    assert (windows == [0, 493, 10, 13]).all()  # round(10 * 4/3) = 13, centred.
    assert _torchvision_window(random.Random(1), 10, 1000) == (0, 493, 10, 13)


def test_a_window_depends_only_on_seed_epoch_and_record():
    def window(seed, epoch, record):
        return crop.window(500, 400, DEFAULT, crop.seed_of(seed, epoch, record)).numpy().tolist()

    assert window(1, 2, 3) == window(1, 2, 3)
    others = {str(window(*place)) for place in [(1, 2, 3), (1, 2, 4), (1, 3, 3), (2, 2, 3)]}
    assert len(others) == 4


@pytest.mark.parametrize("value", [(0.5, 1.0), ((0.5, 1.5), (0.75, 1.33)), ((0, 1), (1, 1)),
                                   ((0.1, 1.0), (2.0, 1.0)), "yes", 3])
def test_bad_arguments_are_refused_naming_it(value):
    with pytest.raises(ValueError, match="random_resized_crop"):
        crop.RandomResizedCrop.from_argument(value)


# --- Through the dataset ----------------------------------------------------


def _gradient_jpegs(root, count=6, size=(120, 160)):
    """JPEGs whose pixel (y, x) encodes its place: red = y, green = x."""
    os.makedirs(root / "a")
    os.makedirs(root / "b")
    ys, xs = np.mgrid[0 : size[0], 0 : size[1]]
    for index in range(count):
        pixels = np.stack([ys * 2, xs * 1.5, np.full(size, 40 * index)], -1).astype(np.uint8)
        Image.fromarray(pixels).save(root / "ab"[index % 2] / f"{index}.jpg", quality=98)
    return str(root)


def _decoded_jpeg(path):
    with open(path, "rb") as f:
        return tf.io.decode_jpeg(f.read(), channels=3)


def test_the_batch_holds_each_window_resized(tmp_path):
    root = _gradient_jpegs(tmp_path / "src")
    # Stored whole (no export-time size cap): windows of the source image.
    ds = DatumDataset(root, image_size=(32, 32), batch_size=3, seed=5, validation_split=None,
                      max_image_side=None, verbose=False)
    train = ds.train(random_resized_crop=True)
    seed = train.stream_state.seed
    order = ds.file_paths("train")
    ids = streams.epoch_ids(tf.constant(seed, tf.int64), tf.constant(0, tf.int64), 6, True)
    images = np.concatenate([x.numpy() for x, _ in train])
    for position, record in enumerate(ids.numpy()):
        full = _decoded_jpeg(order[record])
        top, left, h, w = crop.window(120, 160, DEFAULT, crop.seed_of(seed, 0, record)).numpy()
        expected = tf.image.resize(full[top : top + h, left : left + w], (32, 32)).numpy()
        # Decoded within the window: libjpeg's pixels of the whole image.
        assert np.abs(images[position] - expected).mean() < 1.5, position


def test_a_big_window_decodes_at_half_scale(tmp_path):
    root = _gradient_jpegs(tmp_path / "src", count=2, size=(400, 400))
    with open(os.path.join(root, "a", "0.jpg"), "rb") as f:
        contents = f.read()
    window = tf.constant([20, 40, 300, 200], tf.int32)
    half = crop.decode_jpeg_window(contents, window, (64, 64), 3, 2.5)
    assert half.shape == (150, 100, 3)
    whole = tf.io.decode_jpeg(contents)[20:320, 40:240]
    smaller = tf.image.resize(whole, (150, 100), antialias=True)
    assert np.abs(half.numpy() - smaller.numpy()).mean() < 3
    small = crop.decode_jpeg_window(contents, window, (128, 128), 3, 2.5)
    assert small.shape == (300, 200, 3)  # Under 2.5x the target: full scale.


def test_the_crop_repeats_across_a_restore_and_changes_each_epoch(tmp_path):
    root = _gradient_jpegs(tmp_path / "src", count=8)
    ds = DatumDataset(root, image_size=(16, 16), batch_size=2, seed=3, validation_split=None,
                      cache=True, verbose=False)
    train = ds.train(random_resized_crop=True)
    epochs = [[x.numpy() for x, _ in train] for _ in range(2)]
    resumed = ds.train(random_resized_crop=True)
    resumed.stream_state.restore(positions.Position(1, 4), train.stream_state.seed)
    again = [x.numpy() for x, _ in resumed]
    for a, b in zip(again, epochs[1][2:]):
        np.testing.assert_array_equal(a, b)
    # The decoded cache is off: the second epoch draws new windows.
    first = np.sort(np.concatenate(epochs[0]).reshape(8, -1).sum(1))
    second = np.sort(np.concatenate(epochs[1]).reshape(8, -1).sum(1))
    assert not np.allclose(first, second)


def test_masks_are_cut_to_the_image_window(tmp_path):
    from test_segmentation import write_pairs

    items = []
    ys, xs = np.mgrid[0:60, 0:80]
    for index in range(4):
        mask = np.where(xs < 20 + 10 * index, 1, 2).astype(np.uint8)
        pixels = np.where(mask[..., None] == 1, [255, 0, 0], [0, 0, 255]).astype(np.uint8)
        items.append((f"s{index}", pixels, mask))
    root = write_pairs(tmp_path / "pairs", {"train": items})
    ds = DatumDataset(root, image_size=(20, 20), batch_size=2, seed=1, validation_split=None,
                      verbose=False)
    seen = set()
    for x, y in ds.train(random_resized_crop=True):
        red = x.numpy()[..., 0] > 128
        mask = y.numpy()[..., 0]
        # Nearest masks and bilinear pixels disagree at the edge only.
        assert (red == (mask == 1)).mean() > 0.9
        seen.update(np.unique(mask).tolist())
    assert seen == {1, 2}


def test_boxes_move_into_the_window(tmp_path):
    items = detection_data.draw_items(count=8, size=(80, 120), boxes_in=lambda i: 1,
                                      box_sides=((30, 50), (25, 40)))
    root = detection_data.write_voc(str(tmp_path / "voc"), items)
    ds = DatumDataset(root, image_size=(40, 40), batch_size=4, seed=2, validation_split=None,
                      bounding_box_format="xyxy", verbose=False)
    checked = 0
    for x, y in ds.train(random_resized_crop=True):
        boxes = y["boxes"]
        boxes = boxes.to_tensor(-1).numpy() if hasattr(boxes, "to_tensor") else boxes.numpy()
        for image, image_boxes in zip(x.numpy(), boxes):
            white = image[..., 0] > 128
            kept = [b for b in image_boxes if b[0] >= 0]
            if not white.any():
                assert not kept  # The box fell outside the window.
                continue
            (x1, y1, x2, y2), = kept
            rows, cols = np.nonzero(white)
            # The box bounds the white pixels, to a resized pixel or two.
            assert abs(cols.min() - x1) <= 2 and abs(cols.max() + 1 - x2) <= 2
            assert abs(rows.min() - y1) <= 2 and abs(rows.max() + 1 - y2) <= 2
            checked += 1
    assert checked >= 4


def test_reads_that_cannot_draw_windows_are_refused(class_folders):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, verbose=False)
    with pytest.raises(ValueError, match="random_resized_crop.*unbatched"):
        ds.train(batch_size=None, random_resized_crop=True)
    with pytest.raises(ValueError, match="random_resized_crop"):
        ds.train(random_resized_crop=(0.5, 2.0))


def test_text_is_refused(tmp_path):
    for label in ("pos", "neg"):
        os.makedirs(tmp_path / "text" / label)
        for i in range(3):
            (tmp_path / "text" / label / f"{i}.txt").write_text(f"{label} {i}")
    ds = DatumDataset(str(tmp_path / "text"), batch_size=2, verbose=False)
    with pytest.raises(ValueError, match="random_resized_crop.*text"):
        ds.train(random_resized_crop=True)


def test_png_windows_are_cut_from_the_whole_image(tmp_path):
    os.makedirs(tmp_path / "src" / "a")
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    (tmp_path / "src" / "a" / "0.png").write_bytes(buffer.getvalue())
    ds = DatumDataset(str(tmp_path / "src"), image_size=(10, 10), batch_size=1, seed=4,
                      validation_split=None, max_image_side=None, verbose=False)
    train = ds.train(random_resized_crop=True)
    seed = train.stream_state.seed
    (x, _), = list(train)
    top, left, h, w = crop.window(50, 70, DEFAULT, crop.seed_of(seed, 0, 0)).numpy()
    expected = tf.image.resize(pixels[top : top + h, left : left + w], (10, 10)).numpy()
    np.testing.assert_allclose(x.numpy()[0], expected, atol=1e-3)


def test_each_refusal_says_which_read_cannot_draw_windows():
    from keras_datum import read_plan

    assert "unbatched" in read_plan._crop_refused(None, read_plan.SHARD_NONE, None)
    assert "tf.data service" in read_plan._crop_refused(32, read_plan.SHARD_NONE, "grpc://h:1")
    assert "multi-worker" in read_plan._crop_refused(32, read_plan.SHARD_BY_FILE, None)
    assert "bucketed" in read_plan._crop_refused(32, read_plan.SHARD_NONE, None)


def test_a_slice_reads_with_the_crop_too(tmp_path):
    root = _gradient_jpegs(tmp_path / "src", count=8)
    ds = DatumDataset(root, image_size=(16, 16), batch_size=2, seed=3, validation_split=None,
                      verbose=False)
    plain = np.concatenate([x.numpy() for x, _ in ds.split("train[:50%]")])
    cropped = np.concatenate([x.numpy() for x, _ in ds.split("train[:50%]", random_resized_crop=True)])
    assert plain.shape == cropped.shape == (4, 16, 16, 3)
    assert not np.allclose(np.sort(plain.reshape(4, -1).sum(1)), np.sort(cropped.reshape(4, -1).sum(1)))
