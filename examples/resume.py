"""
Title: Resume a preempted model.fit mid-epoch with keras_datum
Description: Train with keras_datum's BackupAndRestore, kill the process, run it again.

## Introduction

Spot instances, shared clusters and Colab preempt long trainings. Keras's
`BackupAndRestore(save_freq=N)` restores the weights but starts the interrupted
epoch over. keras_datum's callback saves the data position (and the shuffle seed)
with the weights, so a restarted run continues at the saved step with exactly the
batches it would have seen. See docs/resume.md. This example downloads nothing.

Run it, kill it (`--kill-at-step 7` kills itself with SIGKILL, as a preemption
would), and run the same command without the flag: it picks up where the last
backup left off.

    python examples/resume.py --workdir /tmp/resume --kill-at-step 7
    python examples/resume.py --workdir /tmp/resume
"""

import argparse
import json
import os
import signal
import tempfile

import keras

from keras_datum import DatumDataset
from keras_datum.callbacks import BackupAndRestore
from keras_datum.demo import build_model
from keras_datum.demo import make_shapes_dataset

parser = argparse.ArgumentParser()
parser.add_argument("--images-per-class", type=int, default=100)
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--save-freq", type=int, default=2)
parser.add_argument("--kill-at-step", type=int, default=None)
parser.add_argument("--workdir", default=None)
args = parser.parse_args()
workdir = args.workdir or tempfile.mkdtemp(prefix="keras_datum_resume_")

"""
## The data

The shapes dataset of the quickstart, exported on first use. With the default
`seed=None` the read shuffle draws a seed, which the callback saves: the order
resumes, but the augmentation draws anew (the callback warns). With a seed, the
augmentation repeats too.
"""

source = os.path.join(workdir, "shapes")
if not os.path.exists(source):
    make_shapes_dataset(source, args.images_per_class, args.image_size)
ds = DatumDataset(
    source,
    image_size=(args.image_size, args.image_size),
    batch_size=16,
    seed=1337,  # With a seed the augmentation repeats too (else only the order).
    cache_dir=os.path.join(workdir, "cache"),
)

"""
## A backup to resume from?

The callback writes `training_metadata.json` last, naming the weights saved with
the position: whatever moment the process dies at, the two match.
"""

backup_dir = os.path.join(workdir, "backup")
metadata = os.path.join(backup_dir, "training_metadata.json")
if os.path.exists(metadata):
    with open(metadata) as f:
        saved = json.load(f)
    print(f"Resuming after epoch {saved['epoch']}, batch {saved['batch']}")
else:
    print("Starting from scratch")

"""
## Train

Nothing changes in the training loop but the callback. `Preempt` stands in for
the cluster that kills the job.
"""


class Preempt(keras.callbacks.Callback):
    def __init__(self, at_step):
        super().__init__()
        self.at_step, self.steps = at_step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.at_step:
            print(f"Killed after step {self.steps}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


model = build_model((args.image_size, args.image_size), len(ds.class_names))
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
callbacks = [BackupAndRestore(backup_dir, save_freq=args.save_freq)]
if args.kill_at_step:
    callbacks.append(Preempt(args.kill_at_step))
history = model.fit(
    ds.train(augment=[keras.layers.RandomFlip("horizontal")]),
    validation_data=ds.val(),
    epochs=args.epochs,
    callbacks=callbacks,
    verbose=2,
)
print("Epochs run in this process:", len(history.history["loss"]))
print("Validation accuracy:", round(history.history["val_accuracy"][-1], 3))
