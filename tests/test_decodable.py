"""What the export keeps, the reader decodes: files that Pillow reads and
TensorFlow refuses are reported at export, never met in an epoch."""

import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from helpers import fit_one_epoch
from hostile_data import jpeg
from hostile_data import marker_in_scan
from hostile_data import photo
from hostile_data import png
from hostile_data import png_missing_last_row
from hostile_data import png_with_critical_chunk
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import InvalidImageError
from keras_datum import positions


def _refuses(data):
    try:
        tf.io.decode_image(data, expand_animations=False)
    except tf.errors.InvalidArgumentError:
        return True
    return False


def _dataset(root, files, **kwargs):
    """Two class folders of good JPEGs, plus `files` ({name: bytes}) in `a/`."""
    for name in ("a", "b"):
        os.makedirs(root / name, exist_ok=True)
        for i in range(4):
            (root / name / f"good{i}.jpg").write_bytes(jpeg(photo(seed=i)))
    for name, data in files.items():
        (root / "a" / name).write_bytes(data)
    kwargs = {"image_size": (224, 224), "batch_size": 4, **kwargs}
    return DatumDataset(str(root), cache_dir=str(root) + ".cache", verbose=False, **kwargs)


def _report(ds):
    ds.num_examples  # Exports, on first use.
    with open(os.path.join(ds.cache_dir, "invalid_files.json")) as f:
        return {entry["file"]: entry["reason"] for entry in json.load(f)}


def _read_all(ds):
    """Examples the read path yields from train and val (decoding each)."""
    return sum(
        int(x.shape[0])
        for dataset in (ds.train(shuffle=False), ds.val())
        for x, _ in dataset
    )


@pytest.fixture
def hostile_files():
    files = {
        "marker.jpg": marker_in_scan(jpeg(photo())),
        "missing_row_rgb.png": png_missing_last_row(photo((80, 80))),
        "missing_row_rgba.png": png_missing_last_row(
            np.dstack([photo((32, 32)), np.full((32, 32), 200, np.uint8)])
        ),
        "critical_chunk.png": png_with_critical_chunk(photo((40, 40))),
    }
    for name, data in files.items():
        # Each is a file TensorFlow's decoder refuses and Pillow reads.
        assert _refuses(data), name
        if name != "critical_chunk.png":
            Image.open(io.BytesIO(data)).load()
    return files


def test_files_tensorflow_refuses_are_reported_at_export_and_never_read(tmp_path,
                                                                         hostile_files):
    ds = _dataset(tmp_path / "src", hostile_files)
    report = _report(ds)
    assert {f"a/{name}" for name in hostile_files} == set(report)
    assert "TensorFlow's decoder refuses it" in report["a/marker.jpg"]
    assert "missing_row" not in " ".join(ds.file_paths("train") + ds.file_paths("val"))
    assert sum(ds.num_examples.values()) == 8
    assert _read_all(ds) == 8


def test_a_file_tensorflow_refuses_raises_naming_it_with_on_invalid_raise(tmp_path):
    bad = marker_in_scan(jpeg(photo()))
    with pytest.raises(InvalidImageError, match=r"marker\.jpg.*TensorFlow's decoder refuses"):
        _dataset(tmp_path / "src", {"marker.jpg": bad}, on_invalid="raise").num_examples
    assert not os.path.exists(str(tmp_path / "src") + ".cache")


def test_a_damaged_jpeg_that_the_size_cap_converts_is_left_out(tmp_path):
    # Shrunk at export (over the cap): Pillow would decode it, its missing
    # blocks filled in, and store it as a clean image.
    bad = marker_in_scan(jpeg(photo()))
    ds = _dataset(tmp_path / "src", {"marker.jpg": bad}, image_size=(32, 32))
    assert "libjpeg" in _report(ds)["a/marker.jpg"]
    assert _read_all(ds) == 8


def test_a_lossless_jpeg_one_pixel_high_is_stored_as_png(tmp_path):
    imagecodecs = pytest.importorskip("imagecodecs")
    row = (np.arange(40, dtype=np.uint8) * 5).reshape(1, 40)
    data = imagecodecs.jpeg8_encode(row, lossless=True)
    assert _refuses(data)  # TensorFlow's libjpeg has no lossless process.
    ds = _dataset(tmp_path / "src", {"lossless.jpg": data}, image_size=(1, 40),
                  color_mode="grayscale", max_image_side=None)
    assert _report(ds) == {}
    path = str(tmp_path / "src" / "a" / "lossless.jpg")
    split = "train" if path in ds.file_paths("train") else "val"
    index = ds.file_paths(split).index(path)
    reader = ds.train(shuffle=False) if split == "train" else ds.val()
    images = np.concatenate([x.numpy() for x, _ in reader])
    np.testing.assert_array_equal(images[index, ..., 0], row.astype(np.float32))


def test_a_cache_validated_by_older_rules_is_exported_again(tmp_path):
    ds = _dataset(tmp_path / "src", {})
    ds.num_examples  # Exports.
    path = os.path.join(ds.cache_dir, "metadata.json")
    with open(path) as f:
        meta = json.load(f)
    del meta["export_options"]["validation"]
    meta["created"] = "2000-01-01T00:00:00+00:00"
    with open(path, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    again = _dataset(tmp_path / "src", {})
    assert again.num_examples == ds.num_examples
    with open(path) as f:
        meta = json.load(f)
    assert meta["export_options"]["validation"] == 2
    assert meta["created"] != "2000-01-01T00:00:00+00:00"


def _mutants(count, seed=0):
    """Mutated JPEGs (baseline, progressive) and PNGs (with and without raw
    pixels): one byte set to 0xFF, a byte flipped, or the file cut."""
    rng = np.random.default_rng(seed)
    sources = [
        ("jpg", jpeg(photo())), ("jpg", jpeg(photo(seed=1), progressive=True)),
        ("png", png(photo((80, 80)))), ("png", png(photo((32, 32)))),
    ]
    files = {}
    for i in range(count):
        ext, data = sources[i % len(sources)]
        data = bytearray(data)
        at = int(rng.integers(20, len(data)))
        kind = i // len(sources) % 3
        if kind == 0:
            data[at] = 0xFF
        elif kind == 1:
            data[at] ^= 1 << int(rng.integers(8))
        else:
            data = data[:at]
        files[f"m{i:04d}.{ext}"] = bytes(data)
    return files


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"image_size": (224, 224)},  # Kept; decoded whole on reading.
        {"image_size": (64, 64), "max_image_side": None},  # Kept; JPEGs read at half scale.
        {"image_size": (32, 32)},  # JPEGs over the cap, converted.
    ],
)
def test_every_mutated_file_is_reported_at_export_or_read_and_trained_on(tmp_path, options):
    files = _mutants(240)
    ds = _dataset(tmp_path / "src", files, **options)
    report = _report(ds)
    kept = sum(ds.num_examples.values())
    assert len(report) + kept == len(files) + 8
    assert 0 < len(report) < len(files)
    assert _read_all(ds) == kept  # The read path decodes every kept file.
    fit_one_epoch(ds, (*options["image_size"], 3))


def _damage_stored_image(ds, split, position):
    """Rewrites the shard holding the `position`-th example of an unshuffled
    read of `split`, with that example's image damaged (valid record CRCs,
    the same count): what a decoder that differs, or damage the CRC cannot
    see, would give. Returns the example's source file."""
    names = [os.path.relpath(p, ds.source) for p in ds.file_paths(split)]
    target = names[position]
    for shard in ds.info["splits"][split]["shards"]:
        path = os.path.join(ds.cache_dir, shard["file"])
        records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
        for i, raw in enumerate(records):
            example = tf.train.Example.FromString(raw)
            feature = example.features.feature
            if feature["source/filename"].bytes_list.value[0].decode() == target:
                image = feature["image"].bytes_list.value
                image[0] = image[0][: len(image[0]) // 2]  # Cut: TensorFlow refuses it.
                records[i] = example.SerializeToString()
                with tf.io.TFRecordWriter(path) as writer:
                    for record in records:
                        writer.write(record)
                return target
    raise AssertionError(target)


@pytest.mark.parametrize("position", [0, -1])  # A gap inside the epoch, and at its end.
def test_an_image_that_fails_at_read_time_raises_naming_shard_record_and_file(tmp_path,
                                                                             position):
    ds = _dataset(tmp_path / "src", {}, on_invalid="raise")
    target = _damage_stored_image(ds, "val", position)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"record \d+ of shard .*val-\d+-of-\d+\.tfrecord "
                             rf"\(source file {target}\)"):
        for _ in ds.val():
            pass


@pytest.mark.parametrize("position", [0, -1])
def test_an_image_that_fails_at_read_time_is_skipped_and_counted_with_skip(tmp_path,
                                                                          position):
    ds = _dataset(tmp_path / "src", {}, validation_split=0.5)
    _damage_stored_image(ds, "val", position)
    val = ds.val(batch_size=None)
    assert len(val) == ds.num_examples["val"]  # Keras's steps stay right.
    with pytest.warns(RuntimeWarning) as caught:
        seen = [x for x, _ in val]
    assert len(seen) == ds.num_examples["val"]
    messages = [str(w.message) for w in caught]
    if position == 0:  # Counted by the example after it.
        assert any("Skipped examples of the val split that do not decode: 1 (1 in this block"
                   in m for m in messages), messages
    # The places went to a second pass, which says so.
    assert any("their places go to examples of another pass" in m for m in messages)
    fit_one_epoch(ds, (224, 224, 3))


def test_only_images_the_export_cannot_settle_are_decoded_by_tensorflow(tmp_path,
                                                                       monkeypatch):
    from keras_datum import decodable

    decoded = []
    refusal = decodable.image_refusal
    monkeypatch.setattr(decodable, "image_refusal",
                        lambda *args: decoded.append(args[0]) or refusal(*args))
    bad = marker_in_scan(jpeg(photo()))
    ds = _dataset(tmp_path / "src", {"marker.jpg": bad})
    assert list(_report(ds)) == ["a/marker.jpg"]
    assert decoded == [bad]  # The 8 good JPEGs were settled by the strict decode.


# The per-example path, and a shuffled train() read by index (a stream).
@pytest.mark.parametrize("split,read", [("val", {"batch_size": None}), ("train", {})])
def test_the_guard_never_skips_what_the_reading_before_it_raises(tmp_path, split, read):
    # A missing or damaged shard is named as before, with on_invalid="skip"
    # too: the guard drops only examples whose decode fails.
    ds = _dataset(tmp_path / "src", {}, validation_split=0.5)
    shard = os.path.join(ds.cache_dir, ds.info["splits"][split]["shards"][0]["file"])
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(shard, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"Shard .*{split}-.* is damaged"):
        for _ in getattr(ds, split)(**read):
            pass
    os.remove(shard)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"Shard .*{split}-.* is missing"):
        for _ in getattr(ds, split)(**read):
            pass


# A shuffled train() is a stream read by index (see keras_datum/streams.py):
# the same guarantees.


def test_a_stream_names_an_image_that_fails_at_read_time(tmp_path):
    ds = _dataset(tmp_path / "src", {}, on_invalid="raise")
    target = _damage_stored_image(ds, "train", 0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"record \d+ of shard .*train-\d+-of-\d+\.tfrecord "
                             rf"\(source file {target}\)"):
        for _ in ds.train():
            pass


def test_a_stream_skips_and_counts_an_image_that_fails_at_read_time(tmp_path):
    ds = _dataset(tmp_path / "src", {}, validation_split=0.5)
    _damage_stored_image(ds, "train", -1)
    train = ds.train(batch_size=2)
    epochs = []
    for _ in range(4):  # The damaged one lands last in some epoch: counted too.
        with pytest.warns(RuntimeWarning, match="Skipped examples of the train split"):
            seen = [np.asarray(x).tobytes() for batch, _ in train for x in batch]
        assert len(seen) == ds.num_examples["train"] - 1  # No second pass.
        epochs.append(sorted(seen))
    assert all(epoch == epochs[0] for epoch in epochs)  # The same examples each epoch.
    fit_one_epoch(ds, (224, 224, 3))


def test_a_stream_without_cache_keeps_its_batches_around_a_skipped_image(tmp_path):
    # Without the cache, the epochs run on one kept iterator, each batch of
    # records decoded into a batch of its own: the skipped example leaves its
    # batch shorter, and no batch moves into the next epoch. Alone in the
    # last batch, it leaves its epoch one batch short.
    import keras

    ds = _dataset(tmp_path / "src", {}, validation_split=0.5, cache=False, seed=2)
    _damage_stored_image(ds, "train", -1)
    train = ds.train(batch_size=3)
    assert ds.num_examples["train"] == 4 and len(train) == 2  # Batches of 3 and 1.
    with pytest.warns(RuntimeWarning, match="Skipped examples of the train split"):
        epochs = [[len(x) for x, _ in train] for _ in range(8)]
    assert all(sum(sizes) == 3 for sizes in epochs), epochs
    assert [2, 1] in epochs and [3] in epochs, epochs  # Short when it was alone.
    # Keras's TensorFlow trainer takes the short epochs' ends too (the same
    # epochs again: a new kept iterator, at the restored position).
    train.stream_state.restore(positions.Position(0, 0), train.stream_state.seed)
    model = keras.Sequential([keras.Input((224, 224, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(train, epochs=8, verbose=0)
    assert len(history.history["loss"]) == 8
    assert np.isfinite(history.history["loss"]).all()
