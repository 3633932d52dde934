"""Keras callbacks: `BackupAndRestore`, which resumes `model.fit` mid-epoch.

```python
from keras_datum.callbacks import BackupAndRestore
model.fit(ds.train(), epochs=10,
          callbacks=[BackupAndRestore("backup", save_freq=100)])
```

Killed at any step and run again, `fit` goes on with exactly the batches
it would have seen (see docs/resume.md).
"""

import json
import os
import warnings

import keras

from keras_datum import positions
from keras_datum import storage

_METADATA = "training_metadata.json"
_RAN_OUT = "Your input ran out of data"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore`, which also saves where the data is.

    Every `save_freq` batches (or each epoch) it saves the weights (the
    optimizer's state with them) and the position of the keras_datum
    stream being trained on (`ds.train()`: the epoch, the examples of it
    already seen, and the stream's seed, drawn one included), atomically:
    the metadata that names the weights is written last, by a rename, so a
    kill at any moment leaves the last complete backup. On a restart,
    `model.fit(ds.train(), ...)` continues at the saved epoch and step with
    the batches the interrupted run would have seen next; the resumed epoch
    is the shorter for it.

    Args:
        backup_dir: the folder the backups go to.
        save_freq: `"epoch"`, or a number of batches.
        double_checkpoint: also keep the backup before the last one, used
            when the last cannot be read.
        delete_checkpoint: remove `backup_dir` once `fit` ends.
        dataset: the dataset trained on, when it is not the `ds.train()`
            stream built last.

    Raises:
        ValueError: on a restart, the saved position means something else
            for this stream: its split or slice, the export, the batch
            size or the number of replicas changed (the message says which).
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True, dataset=None):
        super().__init__(backup_dir, save_freq=save_freq,
                         double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._dataset = dataset
        self._stream = None
        self._position = None
        self._begin = 0
        self._saves = 0
        self._quiet = None
        self._in_batch = False

    # --- Where the stream is ----------------------------------------------

    def _find_stream(self):
        if self._dataset is not None:
            state, reason = getattr(self._dataset, "stream_state", None), None
            if state is None:
                raise ValueError(
                    "`dataset` must be a resumable keras_datum stream (`ds.train()` with "
                    f"shuffling, or `ds.split(...)`). Received: dataset={self._dataset!r}"
                )
        else:
            state, reason = positions.latest_stream()
        if state is None:
            why = f" (the last one built reads with {reason})" if reason else ""
            warnings.warn(
                f"BackupAndRestore found no resumable keras_datum stream{why}: it "
                "restores the weights and the epoch only, as Keras's does, and a "
                "restarted run begins its epoch anew.",
                stacklevel=3,
            )
        elif state.limits:
            warnings.warn(
                "BackupAndRestore resumes the data order, but not exactly: "
                + "; ".join(state.limits) + ".",
                stacklevel=3,
            )
        return state

    def _advance(self, batches):
        if self._stream is None or self._position is None:
            return
        spec = self._stream.spec
        self._position = positions.advance(
            self._position, batches, spec.num_examples, spec.batch_size, spec.repeat
        )

    def on_train_begin(self, logs=None):
        self._stream = self._find_stream()
        if self._stream is not None:
            self._position = self._stream.next_position
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        # Keras's callback learns the epoch only as one ends, so that a
        # backup made mid-way through a resumed epoch would name epoch 0.
        self._current_epoch = epoch
        # The epoch's iterator starts where the batches seen so far end
        # (Keras may have made, and left, iterators in between).
        if self._stream is not None:
            self._stream.restore(self._position, self._stream.seed)
        # A resumed epoch is shorter than Keras counts: its end is no
        # shortage of data.
        self._quiet = warnings.catch_warnings()
        self._quiet.__enter__()
        warnings.filterwarnings("ignore", message=_RAN_OUT)

    def on_epoch_end(self, epoch, logs=None):
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        super().on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self._advance(batch - self._begin + 1)
        self._in_batch = True
        try:
            super().on_train_batch_end(batch, logs)
        finally:
            self._in_batch = False

    def on_train_end(self, logs=None):
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        super().on_train_end(logs)

    # --- Saving and loading -----------------------------------------------

    def _data_state(self):
        if self._stream is None:
            return None
        return {
            "position": self._position.to_json(),
            "seed": self._stream.seed,
            "spec": self._stream.spec.to_json(),
        }

    def _save_model(self):
        storage.makedirs(self.backup_dir, exist_ok=True)
        previous = self._read_metadata()
        self._saves += 1
        name = f"backup-{os.getpid()}-{self._saves}.weights.h5"
        self.model.save_weights(storage.join(self.backup_dir, name), overwrite=True)
        if previous is not None:
            previous.pop("previous", None)
        epoch, batch = self._progress()
        metadata = {
            "epoch": epoch,
            "batch": batch,
            "weights": name,
            "keras_datum": self._data_state(),
            # Restored when the last weights cannot be read.
            "previous": previous if self.double_checkpoint else None,
        }
        temporary = storage.join(self.backup_dir, f".{_METADATA}.{os.getpid()}")
        storage.write_text(temporary, json.dumps(metadata))
        # The commit: the metadata names the weights saved with it.
        storage.rename(temporary, storage.join(self.backup_dir, _METADATA))
        kept = previous if self.double_checkpoint else None
        self._remove_old(keep={name, (kept or {}).get("weights")})

    def _progress(self):
        """`(epoch, batch)`: the Keras epoch to resume at, and its last batch
        done (-1: none). From the stream's position, which counts the
        batches of a resumed epoch from its start, and rolls over to the
        next epoch after the last one (Keras's own callback would repeat
        that epoch whole)."""
        spec = self._stream.spec if self._stream is not None else None
        if spec is None or spec.repeat or self._position is None:
            return self._current_epoch, self._last_batch_seen
        if self._position.offset == 0 and self._in_batch:
            return self._current_epoch + 1, -1
        return self._current_epoch, self._position.offset // spec.batch_size - 1

    def _remove_old(self, keep):
        for entry in storage.listdir(self.backup_dir):
            if entry.endswith(".weights.h5") and entry not in keep:
                storage.remove(storage.join(self.backup_dir, entry))

    def _read_metadata(self):
        path = storage.join(self.backup_dir, _METADATA)
        if not storage.exists(path):
            return None
        with storage.open(path) as f:
            return json.load(f)

    def _load_model(self):
        if not self.model.built:
            super()._load_model()  # Keras's error for an unbuilt model.
        metadata = self._read_metadata()
        if metadata is None:
            return
        metadata = self._load_weights(metadata)
        self.model._initial_epoch = metadata["epoch"]
        data = metadata.get("keras_datum")
        if data is not None and self._stream is not None:
            self._restore_stream(data)

    def _load_weights(self, metadata):
        """Loads the weights `metadata` names, or those of the backup before
        it (`double_checkpoint`) when they cannot be read; returns the
        metadata of those loaded."""
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        try:
            self.model.load_weights(storage.join(self.backup_dir, metadata["weights"]))
            return metadata
        except OSError:
            previous = metadata.get("previous")
            if not previous:
                raise
            self.model.load_weights(storage.join(self.backup_dir, previous["weights"]))
            return previous

    def _restore_stream(self, data):
        saved = positions.StreamSpec(**data["spec"])
        changed = self._stream.spec.differences(saved)
        if changed:
            raise ValueError(
                f"Cannot resume from the backup in {self.backup_dir!r}: the training "
                "stream changed since it was saved, so its saved position means other "
                f"examples now ({'; '.join(changed)}). Train with what it was saved "
                "with, or remove the backup to start over."
            )
        self._position = positions.Position.from_json(data["position"])
        self._stream.restore(self._position, data["seed"])
