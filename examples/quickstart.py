"""
Title: Image classification from a folder with keras_datum
Description: Draw a small dataset, export it to validated TFRecords once, train a CNN on it.

## Introduction

`keras.utils.image_dataset_from_directory` decodes every file again in every epoch,
and a single corrupt JPEG stops training. keras_datum validates every image once,
writes sharded TFRecords plus JSON metadata to a cache, and hands `model.fit` the
same `(x, y)` batches that Keras would. This example is the `keras-datum demo`
job, step by step. It downloads nothing.

Run it with `python examples/quickstart.py` (`--help` lists the sizes to shrink it).
"""

import argparse
import os
import tempfile

import keras

from keras_datum import DatumDataset
from keras_datum.demo import build_model
from keras_datum.demo import make_shapes_dataset

parser = argparse.ArgumentParser()
parser.add_argument("--images-per-class", type=int, default=500)
parser.add_argument("--image-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--workdir", default=None)
args = parser.parse_args()
workdir = args.workdir or tempfile.mkdtemp(prefix="keras_datum_quickstart_")

"""
## Make a dataset

One folder per class, as `image_dataset_from_directory` expects: each image is a
circle, a square or a triangle in a random colour on a noisy background.
"""

source = make_shapes_dataset(
    os.path.join(workdir, "shapes"), args.images_per_class, args.image_size
)
print(sorted(os.listdir(source)))

"""
## Point a DatumDataset at it

This only checks the arguments. Nothing is read until the data is needed. We keep
the cache next to the data here; by default it goes to `~/.keras/datum/`.
"""

ds = DatumDataset(
    source,
    image_size=(args.image_size, args.image_size),
    batch_size=32,
    validation_split=0.2,
    seed=1337,
    cache_dir=os.path.join(workdir, "cache"),
)

"""
## Export on first use

Asking for the class names triggers the export: the layout is detected, 20% of each
class is carved into a validation split, every image is decoded once, and the
shards and `metadata.json` are written. Running this script again reuses them.
"""

print("Classes:", ds.class_names)
print("Examples:", ds.num_examples)
print("Invalid files left out:", ds.info["invalid_files"]["count"])

"""
## Train

`x` is float32 in [0, 255], as from Keras, so the model starts with a
`Rescaling(1 / 255)` layer.
"""

keras.utils.set_random_seed(1337)
model = build_model((args.image_size, args.image_size), len(ds.class_names))
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)
model.fit(ds.train(), validation_data=ds.val(), epochs=args.epochs, verbose=2)

"""
## Result

On the default sizes this reaches about 0.97 validation accuracy (chance is 0.33).
"""

_, accuracy = model.evaluate(ds.val(), verbose=0)
print(f"Validation accuracy: {accuracy:.3f}")
