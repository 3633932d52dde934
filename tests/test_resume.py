"""Mid-epoch resume: the position arithmetic, the stream's restart, and real
`model.fit` runs SIGKILLed mid-epoch and restarted (see resume_script.py)."""

import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import decoded_store
from keras_datum import epochs
from keras_datum import positions
from keras_datum.callbacks import BackupAndRestore

SCRIPT = os.path.join(os.path.dirname(__file__), "resume_script.py")


# --- The arithmetic ---------------------------------------------------------


def test_steps_per_epoch_counts_the_partial_last_batch():
    assert positions.steps_per_epoch(10, 4) == 3
    assert positions.steps_per_epoch(8, 4) == 2
    assert positions.steps_per_epoch(0, 4) == 0


def test_advance_without_repeat_ends_each_epoch_with_its_partial_batch():
    start = positions.Position(0, 0)
    # 10 examples, global batch 4: batches of 4, 4, 2 per epoch.
    assert positions.advance(start, 2, 10, 4, repeat=False) == positions.Position(0, 8)
    assert positions.advance(start, 3, 10, 4, repeat=False) == positions.Position(1, 0)
    assert positions.advance(start, 7, 10, 4, repeat=False) == positions.Position(2, 4)
    mid = positions.Position(1, 8)
    assert positions.advance(mid, 1, 10, 4, repeat=False) == positions.Position(2, 0)


def test_advance_with_repeat_runs_epochs_into_each_other():
    # 10 examples, global batch 4: the third batch holds 2 of epoch 0 and
    # 2 of epoch 1.
    start = positions.Position(0, 0)
    assert positions.advance(start, 3, 10, 4, repeat=True) == positions.Position(1, 2)
    assert positions.advance(start, 5, 10, 4, repeat=True) == positions.Position(2, 0)


def test_the_global_batch_counts_every_replica():
    # 2 replicas of 3: a global batch of 6 over 14 examples, 3 steps.
    assert positions.steps_per_epoch(14, 2 * 3) == 3
    assert positions.advance(positions.Position(), 3, 14, 6, False) == positions.Position(1, 0)


def test_the_export_identity_ignores_when_the_files_were_written():
    meta = {"splits": {"train": {"num_examples": 4}}, "created": "monday",
            "source_fingerprint": {"digest": "a1", "num_files": 4, "num_bytes": 10}}
    # The same files copied to a new machine: new modification times.
    copied = dict(meta, created="tuesday",
                  source_fingerprint={"digest": "b2", "num_files": 4, "num_bytes": 10})
    assert positions.export_identity(copied) == positions.export_identity(meta)
    grown = dict(meta, source_fingerprint={"digest": "c3", "num_files": 5, "num_bytes": 12})
    assert positions.export_identity(grown) != positions.export_identity(meta)
    recarved = dict(meta, splits={"train": {"num_examples": 3}})
    assert positions.export_identity(recarved) != positions.export_identity(meta)


def test_stream_spec_names_what_changed():
    spec = positions.StreamSpec("train", "abc", 10, 4, 1, False, True)
    other = positions.StreamSpec("train", "abc", 10, 8, 2, False, True)
    assert other.differences(spec) == ["batch_size: 4 -> 8", "replicas: 1 -> 2"]


# --- The stream -------------------------------------------------------------


def _sums(dataset, epochs):
    return [
        [x.numpy().reshape(len(x), -1).sum(1).round(3).tolist() for x, _ in dataset]
        for _ in range(epochs)
    ]


@pytest.mark.parametrize("cache", [False, True])
def test_a_restored_stream_continues_the_uninterrupted_one(class_folders, cache):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, seed=3, cache=cache)
    augment = [keras.layers.RandomFlip("horizontal")]
    uninterrupted = ds.train(augment=augment)
    full = _sums(uninterrupted, 3)
    resumed = ds.train(augment=augment)
    resumed.stream_state.restore(positions.Position(1, 8), uninterrupted.stream_state.seed)
    again = _sums(resumed, 2)
    assert again[0] == full[1][2:]
    assert again[1] == full[2]
    # Keras's count stays the whole epoch's.
    assert len(resumed) == len(full[0])


def test_an_eager_iterator_reads_a_complete_store_alone():
    spec = tf.TensorSpec([2], tf.uint8)
    store = decoded_store.DecodedStore(1, spec)
    choosing = tf.data.Dataset.from_tensors(tf.constant([1, 1], tf.uint8))
    stored = tf.data.Dataset.from_tensors(tf.constant([0], tf.int64)).map(
        lambda ids: store.get(ids)[0]
    )
    stream = epochs.Epochs(choosing, 1, state=None, stored=(stored, store))
    assert [e.numpy().tolist() for e in stream] == [[1, 1]]  # Not complete yet.
    store.put(tf.constant([[7, 9]], tf.uint8), tf.constant([0], tf.int64))
    assert [e.numpy().tolist() for e in stream] == [[7, 9]]
    # A dataset made from the stream (a strategy's, say) chooses in the graph.
    assert [e.numpy().tolist() for e in stream.map(lambda e: e)] == [[1, 1]]


def _kept(train):
    """The iterator an epoch of `train` reads from (kept across epochs, or
    its own), and the epoch's sums."""
    iterator = iter(train)
    kept = iterator._iterator if isinstance(iterator, epochs._EpochView) else None
    sums = [x.numpy().reshape(len(x), -1).sum(1).round(3).tolist() for x, _ in iterator]
    return kept, sums


@pytest.mark.parametrize("where", [None, "batch_augment", "augment"])
def test_cached_epochs_follow_each_other_on_one_kept_iterator(class_folders, where):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=7, seed=3)
    # A per-example augment batches each epoch again (its last batch padded
    # to a whole one, the pads dropped after).
    augment = {where: [keras.layers.RandomFlip("horizontal")]} if where else {}
    train = ds.train(**augment)
    filling, first = _kept(train)
    assert filling is None  # The epoch that fills the cache has its own.
    assert 0 < len(first[-1]) < 7  # The last batch is partial.
    # Its end made the next epoch's kept iterator ahead, with its first
    # batch, and left the stream's position to the view that serves it.
    for _ in range(500):
        prepared = train._running._kept
        if prepared is not None:
            break
        time.sleep(0.01)
    assert prepared is not None and prepared.pending is not None
    assert train.stream_state.next_position == positions.Position(1, 0)
    reads = [_kept(train) for _ in range(3)]
    kept = reads[0][0]
    assert kept is prepared.iterator
    assert kept is not None and all(k is kept for k, _ in reads)
    # The same batches as a stream that makes an iterator per epoch.
    fresh = ds.train(**augment)
    fresh.stream_state.restore(positions.Position(0, 0), train.stream_state.seed)
    assert [first] + [sums for _, sums in reads] == _sums(fresh, 4)
    assert len({len(sums) for _, sums in reads}) == 1  # Each epoch whole.
    # An epoch is claimed by its first batch, as a tf.data iterator's is.
    position = train.stream_state.next_position
    iter(train)
    assert train.stream_state.next_position == position
    # `get_next` ends an epoch as a tf.data iterator does.
    view = iter(train)
    for _ in first:
        view.get_next()
    with pytest.raises(tf.errors.OutOfRangeError):
        view.get_next()


def test_a_kept_iterator_gives_way_to_an_unfinished_or_restored_epoch(class_folders):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, seed=3)
    train = ds.train()
    full = _sums(train, 4)
    # Left after one batch: the next epoch is the one after it, read anew.
    train.stream_state.restore(positions.Position(1, 0), train.stream_state.seed)
    kept, _ = _kept(train)
    iterator = iter(train)
    next(iterator)
    assert _kept(train)[1] == full[3]
    assert _kept(train)[0] is not kept
    # A restored position: mid-epoch (the stream's own iterator), then an
    # epoch that is not the next one.
    train.stream_state.restore(positions.Position(1, 8), train.stream_state.seed)
    assert _kept(train) == (None, full[1][2:])
    train.stream_state.restore(positions.Position(3, 0), train.stream_state.seed)
    restored, epoch_3 = _kept(train)
    assert epoch_3 == full[3]
    kept, epoch_4 = _kept(train)
    assert kept is restored
    fresh = ds.train()
    fresh.stream_state.restore(positions.Position(4, 0), train.stream_state.seed)
    assert epoch_4 == _sums(fresh, 1)[0]


def test_each_epoch_is_a_new_permutation_of_the_split(class_folders):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, seed=3)
    train = ds.train()
    epochs = _sums(train, 2)
    first, second = (sorted(sum(e, [])) for e in epochs)
    assert first == second  # The same examples, each once.
    assert sum(epochs[0], []) != sum(epochs[1], [])  # In another order.


def test_an_unseeded_stream_draws_a_seed_it_can_resume_with(class_folders):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4)
    train = ds.train()
    assert not train.stream_state.seed_given
    full = _sums(train, 1)[0]
    resumed = ds.train()
    resumed.stream_state.restore(positions.Position(0, 4), train.stream_state.seed)
    assert _sums(resumed, 1)[0] == full[1:]


# --- The callback -----------------------------------------------------------


def _tiny_model():
    model = keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(3),
    ])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_the_callback_refuses_a_backup_of_another_batch_size(class_folders, tmp_path):
    backup = str(tmp_path / "backup")
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, seed=3)
    model = _tiny_model()
    callback = BackupAndRestore(backup, save_freq=1, delete_checkpoint=False)
    model.fit(ds.train(), epochs=1, verbose=0, callbacks=[callback])
    other = DatumDataset(class_folders, image_size=(8, 8), batch_size=2, seed=3)
    with pytest.raises(ValueError, match=r"batch_size: 4 -> 2"):
        _tiny_model().fit(other.train(), epochs=2, verbose=0,
                          callbacks=[BackupAndRestore(backup, save_freq=1)])


def test_the_backup_names_the_weights_saved_with_it(class_folders, tmp_path):
    backup = tmp_path / "backup"
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, seed=3)
    callback = BackupAndRestore(str(backup), save_freq=2, delete_checkpoint=False)
    _tiny_model().fit(ds.train(), epochs=1, verbose=0, callbacks=[callback])
    metadata = json.loads((backup / "training_metadata.json").read_text())
    weights = sorted(p.name for p in backup.glob("*.weights.h5"))
    assert weights == [metadata["weights"]]  # Older ones are gone.
    assert metadata["keras_datum"]["seed"] == 3
    assert metadata["keras_datum"]["spec"]["batch_size"] == 4


def test_the_callback_names_what_a_resume_does_not_repeat(class_folders, tmp_path):
    ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4)
    train = ds.train(augment=keras.layers.RandomFlip())
    callback = BackupAndRestore(str(tmp_path / "backup"), dataset=train)
    callback.set_model(_tiny_model())
    with pytest.warns(UserWarning, match=r"not exactly: augmentation without a seed"):
        callback.on_train_begin()


def test_the_callback_names_a_split_that_cannot_resume(class_folders, tmp_path):
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0)
    )
    try:
        ds = DatumDataset(class_folders, image_size=(8, 8), batch_size=4, seed=1)
        ds.train()
        ds.train(data_service=dispatcher.target)
        callback = BackupAndRestore(str(tmp_path / "backup"))
        callback.set_model(_tiny_model())
        with pytest.warns(UserWarning, match=r"no resumable .*tf\.data service"):
            callback.on_train_begin()
    finally:
        dispatcher.stop()


# --- Killed and restarted -----------------------------------------------------


def _images(root, count=30, size=72):
    """Images whose top-left and bottom-right values spell their number
    (flat halves survive the resize), with noise on the other channels so
    that a flip shows."""
    rng = np.random.default_rng(0)
    for number in range(count):
        folder = os.path.join(root, "abc"[number % 3])
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        pixels[: size // 2, :, 0] = number % 256
        pixels[size // 2:, :, 0] = number // 256
        Image.fromarray(pixels).save(os.path.join(folder, f"{number:03d}.png"))
    return root


def _run(tmp_path, name, images, extra=(), env=None):
    log = tmp_path / f"{name}.log"
    command = [
        sys.executable, SCRIPT, images, str(tmp_path / f"cache-{name.split('-')[0]}"),
        str(tmp_path / f"backup-{name}"), str(log), *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, **(env or {})))
    return result, log


def _steps(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _killed_and_restarted(tmp_path, images, name, kill_at, extra, env):
    """The steps of a run killed after `kill_at` steps up to its last backup,
    then those of its restart."""
    result, log = _run(tmp_path, name, images, [*extra, "--kill-at", str(kill_at)], env)
    assert result.returncode == -9, result.stderr[-3000:]
    killed = _steps(log)
    assert len(killed) == kill_at
    backup = tmp_path / f"backup-{name}" / "training_metadata.json"
    saved = json.loads(backup.read_text())
    log.unlink()
    result, log = _run(tmp_path, name, images, extra, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return saved, killed, _steps(log)


def _check_exactly_once_per_epoch(steps, count):
    epochs = {}
    for step in steps:
        epochs.setdefault(step["epoch"], []).extend(n for n, _ in step["examples"])
    for numbers in epochs.values():
        assert sorted(numbers) == sorted(set(numbers))
        assert len(numbers) == count


CASES = {
    # name: (kill points, script arguments, environment)
    # Early, mid-epoch, at the first epoch's last step, just before the end.
    "tf": ([2, 9, 6, 17], [], {"KERAS_BACKEND": "tensorflow"}),
    "tfcache": ([9], ["--cache-mode", "on"], {"KERAS_BACKEND": "tensorflow"}),
    "jax": ([11], [], {"KERAS_BACKEND": "jax"}),
    "jaxcache": ([5], ["--cache-mode", "on"], {"KERAS_BACKEND": "jax"}),
    "mirrored": ([8], ["--mirrored"], {"KERAS_BACKEND": "tensorflow"}),
    "torch": ([10], [], {"KERAS_BACKEND": "torch"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_killed_fit_continues_with_exactly_the_batches_it_would_have_seen(tmp_path, case):
    kill_points, extra, env = CASES[case]
    images = _images(str(tmp_path / "images"))
    result, log = _run(tmp_path, f"{case}-baseline", images, extra, env)
    assert result.returncode == 0, result.stderr[-3000:]
    baseline = _steps(log)
    per_epoch = sum(1 for step in baseline if step["epoch"] == 0)
    train_examples = sum(len(step["examples"]) for step in baseline if step["epoch"] == 0)
    assert len(baseline) == 3 * per_epoch
    _check_exactly_once_per_epoch(baseline, train_examples)
    for kill_at in kill_points:
        saved, killed, restarted = _killed_and_restarted(
            tmp_path, images, f"{case}-kill{kill_at}", kill_at, extra, env
        )
        done = saved["epoch"] * per_epoch + saved["batch"] + 1
        assert done <= kill_at
        # The sequence after the restart is the uninterrupted run's, the
        # augmentation (the pixel hashes) included.
        assert killed[:done] + restarted == baseline, (case, kill_at, done)
