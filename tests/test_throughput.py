"""`keras-datum benchmark`'s measurement: what it counts, not how fast."""

import os

import pytest
from conftest import make_class_folders
from test_datum_format import classification_export
from test_text import write_text_folders

from keras_datum import DatumDataset
from keras_datum import throughput


def test_measure_times_every_epoch_of_the_split(class_folders):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=4, verbose=False)
    result = throughput.measure(ds, "train", epochs=2)
    examples = ds.num_examples["train"]
    assert result["exported"] is True
    assert result["split"] == "train" and result["examples"] == examples == 24
    assert result["batch_size"] == 4
    assert [epoch["images"] for epoch in result["epochs"]] == [examples, examples]
    for epoch in result["epochs"]:
        assert 0 < epoch["first_batch_seconds"] <= epoch["seconds"]
        assert epoch["images_per_second"] == pytest.approx(examples / epoch["seconds"])
    # 24 images of 16x16x3 as uint8, plus the per-example allowance.
    assert result["cache"] == {
        "on": True, "decoded_bytes": 24 * (16 * 16 * 3 + 64),
        "budget_bytes": result["cache"]["budget_bytes"],
    }
    assert result["cache"]["budget_bytes"] > result["cache"]["decoded_bytes"]
    assert result["decode"]["records"] == examples
    assert result["decode"]["images_per_second"] > 0

    again = throughput.measure(ds, "val", epochs=1)
    assert again["exported"] is False  # The cache was up to date.
    assert again["epochs"][0]["images"] == ds.num_examples["val"] == 6

    lines = throughput.report(result)
    assert lines[0] == "train: 24 examples, batches of 4, " + f"{throughput.cores()} cores"
    assert lines[1].startswith("export: ") and "up to date" not in lines[1]
    assert lines[2].startswith("decoded cache: on, 0 MB of a ")
    assert lines[3].startswith("decoding from memory: ") and "(24 records" in lines[3]
    assert [line.split(":")[0] for line in lines[4:]] == ["epoch 1", "epoch 2"]
    assert "up to date" in throughput.report(again)[1]
    assert result["keras"] is None and not any("Keras" in line for line in lines)


def test_keras_epoch_over_the_same_folder(class_folders):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=4, verbose=False)
    result = throughput.measure(ds, "train", epochs=1, keras=True)
    assert result["keras"]["images"] == 30  # Every file: Keras reads the whole folder.
    assert result["keras"]["images_per_second"] > 0
    lines = throughput.report(result)
    assert "keras.utils.image_dataset_from_directory: " in lines[4]
    assert "(one epoch over all 30 files)" in lines[4]
    assert lines[5].startswith("epoch 1: ") and "x decoding, " in lines[5] and lines[5].endswith("x Keras)")


@pytest.mark.parametrize("limit", ["DECODE_RECORDS", "DECODE_BYTES"])
def test_decode_rate_reads_at_most_the_records_asked(class_folders, monkeypatch, limit):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=4, verbose=False, cache=False)
    info = ds.info["splits"]["train"]
    size = sum(os.path.getsize(os.path.join(ds.cache_dir, s["file"])) for s in info["shards"])
    record_bytes = size // info["num_examples"]
    monkeypatch.setattr(throughput, limit, 5 if limit == "DECODE_RECORDS" else 5 * record_bytes)
    result = throughput.measure(ds, "train", epochs=1)
    assert result["decode"]["records"] == 5
    assert result["cache"]["on"] is False and result["cache"]["budget_bytes"] is None
    assert "decoded cache: off (0 MB): every epoch decodes" in throughput.report(result)


def test_text_has_no_decode_rate(tmp_path):
    root, _ = write_text_folders(tmp_path / "src")
    ds = DatumDataset(root, batch_size=4, verbose=False)
    result = throughput.measure(ds, "train", epochs=1, keras=True)
    assert result["decode"] is None
    assert result["epochs"][0]["images"] == ds.num_examples["train"]
    assert result["keras"] == {
        "not_applicable": "it reads image class folders, and this source is text "
        "in the 'class_folders' layout"
    }
    lines = throughput.report(result)
    assert not any(line.startswith("decoding") for line in lines)
    assert "keras.utils.image_dataset_from_directory: not timed: it reads image" in lines[3]
    assert "x Keras" not in lines[4] and "(" not in lines[4]


def test_bad_arguments_are_refused_before_any_export(class_folders):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=None, verbose=False)
    with pytest.raises(ValueError, match="`batch_size` must not be None"):
        throughput.measure(ds)
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=4, verbose=False)
    with pytest.raises(ValueError, match="Received: split='training'"):
        throughput.measure(ds, "training")
    assert not os.path.exists(ds.cache_dir)
    ds.export()
    with pytest.raises(ValueError, match=r"no 'test' split. Its splits are \['train', 'val'\]"):
        throughput.measure(ds, "test")


def test_unlabelled_batches_are_counted_by_their_images(class_folders):
    # Batches of two images and no labels: unpacking them as `(x, y)` would
    # count the first image's height.
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=2, label_mode=None, verbose=False)
    assert ds.train().element_spec.shape.as_list() == [None, 16, 16, 3]
    result = throughput.measure(ds, "train", epochs=1)
    assert result["epochs"][0]["images"] == ds.num_examples["train"] == 24


def test_keras_is_not_timed_where_it_would_fail(tmp_path):
    # An invalid file: keras_datum leaves it out, Keras's epoch would stop on it.
    root = make_class_folders(tmp_path / "src", {"a": 6, "b": 6})
    (tmp_path / "src" / "a" / "broken.png").write_bytes(b"not a png")
    ds = DatumDataset(root, image_size=(16, 16), batch_size=4, verbose=False)
    with pytest.warns(UserWarning, match="1 invalid files"):
        result = throughput.measure(ds, "train", epochs=1, keras=True)
    assert result["keras"] == {
        "not_applicable": "1 files of the folder are not valid images "
        "(see `keras-datum info`), and one stops Keras's epoch"
    }
    assert result["epochs"][0]["images"] == ds.num_examples["train"]
    # WebP files, which keras_datum reads and Keras does not list.
    root = make_class_folders(tmp_path / "webp", {"a": 4, "b": 4}, ext="webp")
    ds = DatumDataset(root, image_size=(16, 16), batch_size=4, verbose=False)
    result = throughput.measure(ds, "train", epochs=1, keras=True)
    assert result["keras"]["not_applicable"].startswith("Keras failed on this folder: No images found")
    assert "not timed: Keras failed" in throughput.report(result)[4]


def test_a_datum_export_is_read_in_place_not_exported(tmp_path):
    export_dir, _ = classification_export(tmp_path)
    ds = DatumDataset(export_dir, batch_size=3, verbose=False)
    result = throughput.measure(ds, "train", epochs=1)
    assert result["exported"] is False and result["in_place"] is True
    assert result["epochs"][0]["images"] == 9
    assert throughput.report(result)[1] == "export: none, a datum export is read in place"


def test_epochs_must_be_at_least_one(class_folders):
    ds = DatumDataset(class_folders, image_size=(16, 16), batch_size=4, verbose=False)
    with pytest.raises(ValueError, match="Received: epochs=0"):
        throughput.measure(ds, epochs=0)
    assert not os.path.exists(ds.cache_dir)


def _batches(work):
    """Two batches of 2 images, each made after `work()` runs in Python."""
    import tensorflow as tf

    def make(_):
        work()
        return tf.zeros((2, 4, 4, 3)), tf.zeros((2,))

    return tf.data.Dataset.range(2).map(
        lambda i: tf.py_function(make, [i], (tf.float32, tf.float32))
    )


def test_an_epoch_counts_the_cpu_time_it_took():
    import time

    def spin():  # 0.2 s of this process's CPU time per batch.
        start = time.process_time()
        while time.process_time() - start < 0.2:
            pass

    busy = throughput.time_epoch(_batches(spin))
    assert busy["images"] == 4
    assert busy["cores_busy"] * busy["seconds"] >= 0.4
    idle = throughput.time_epoch(_batches(lambda: time.sleep(0.3)))
    assert idle["seconds"] >= 0.6
    assert idle["cores_busy"] * idle["seconds"] < 0.3
    assert "cores busy" in throughput.report(
        {"split": "train", "examples": 4, "batch_size": 2, "cores": 2, "exported": True,
         "export_seconds": 0.1, "cache": {"on": False, "decoded_bytes": 0, "budget_bytes": None},
         "decode": None, "epochs": [busy]}
    )[-1]
