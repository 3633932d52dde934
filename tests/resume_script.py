"""Run in a subprocess (see test_resume.py): trains with keras_datum's
BackupAndRestore and logs, for each step, the examples the model saw.

    python resume_script.py IMAGES CACHE BACKUP LOG [--kill-at STEP]
        [--cache on|off] [--mirrored] [--save-freq N] [--epochs N]

Each image is two flat halves whose values encode its number, so the model's
first layer can read which example it got (`Spy`); a hash of the pixels
shows the augmentation. With `--kill-at`, the process SIGKILLs itself after
that many steps (counted over the epochs).
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import threading

parser = argparse.ArgumentParser()
parser.add_argument("images")
parser.add_argument("cache")
parser.add_argument("backup")
parser.add_argument("log")
parser.add_argument("--kill-at", type=int)
parser.add_argument("--cache-mode", default="off")
parser.add_argument("--mirrored", action="store_true")
parser.add_argument("--save-freq", type=int, default=2)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

if args.mirrored:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_datum import DatumDataset  # noqa: E402
from keras_datum.callbacks import BackupAndRestore  # noqa: E402

_seen = []
_lock = threading.Lock()


def _record(images):
    images = np.asarray(images)
    with _lock:
        for image in images:
            number = int(round(float(image[0, 0, 0]))) + 256 * int(round(float(image[-1, -1, 0])))
            digest = hashlib.sha1(np.round(image).astype(np.uint8).tobytes()).hexdigest()[:8]
            _seen.append([number, digest])


class Spy(keras.layers.Layer):
    """Passes its input on, noting each example it sees (run eagerly)."""

    def call(self, inputs):
        _record(keras.ops.convert_to_numpy(inputs))
        return inputs

    def compute_output_spec(self, inputs):
        return inputs  # shapes are worked out without calling (and logging)


class Log(keras.callbacks.Callback):
    """Writes the examples of each step as one line, then maybe dies."""

    def __init__(self):
        super().__init__()
        self.steps = 0
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with _lock:
            seen = sorted(_seen)
            _seen.clear()
        with open(args.log, "a") as f:
            f.write(json.dumps({"epoch": self.epoch, "examples": seen}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.steps += 1
        if args.kill_at is not None and self.steps == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


strategy = (
    __import__("tensorflow").distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    if args.mirrored else "auto"
)
ds = DatumDataset(args.images, image_size=(12, 12), batch_size=4, cache_dir=args.cache,
                  cache=args.cache_mode == "on", seed=7, strategy=strategy, verbose=False)
with ds.strategy.scope():
    model = keras.Sequential([
        keras.Input((12, 12, 3)), Spy(), keras.layers.Rescaling(1 / 255),
        keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", run_eagerly=True)
train = ds.train(augment=[keras.layers.RandomFlip("horizontal", seed=1)])
model.fit(
    train, epochs=args.epochs, verbose=0,
    callbacks=[BackupAndRestore(args.backup, save_freq=args.save_freq), Log()],
)
sys.exit(0)
