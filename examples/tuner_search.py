"""
Title: Hyperparameter search with KerasTuner on a keras_datum dataset
Description: RandomSearch over learning rate, batch size and augmentation strength; the export happens once.

## Introduction

Every KerasTuner trial needs the same data with different settings. With
keras_datum the first trial exports the folder, and every later trial (in this
process or in another tuner worker) reuses the cache: only read-time settings
change, such as the batch size and the augmentation, and those never re-export.

Run: `python examples/tuner_search.py [--source DIR] [--trials 4] [--epochs 3]`.
Without `--source` it draws the demo's shapes dataset. Nothing is downloaded.
"""

import argparse
import os
import tempfile

import keras
import keras_tuner

from keras_datum import DatumDataset
from keras_datum.demo import build_model
from keras_datum.demo import make_shapes_dataset

"""
## The hypermodel

`build` makes the model with a searched learning rate. `fit` makes a
`DatumDataset` for the trial (cheap: it reads the cache) and searches the batch
size and the strength of a KerasCV-style augmentation pipeline, which belong to
the data, not to the model.
"""


class DatumHyperModel(keras_tuner.HyperModel):
    def __init__(self, source, image_size=64, cache_dir=None, **kwargs):
        super().__init__(**kwargs)
        self.source = source
        self.image_size = image_size
        self.cache_dir = cache_dir

    def dataset(self):
        return DatumDataset(
            self.source,
            image_size=(self.image_size, self.image_size),
            seed=1337,
            cache_dir=self.cache_dir,
            verbose=False,
        )

    def build(self, hp):
        num_classes = len(self.dataset().class_names)
        model = build_model((self.image_size, self.image_size), num_classes)
        learning_rate = hp.Float("learning_rate", 1e-4, 1e-2, sampling="log")
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        return model

    def fit(self, hp, model, *args, **kwargs):
        ds = self.dataset()
        batch_size = hp.Choice("batch_size", [16, 32, 64])
        strength = hp.Float("augment_strength", 0.0, 0.3, step=0.1)
        augment = [
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomRotation(strength),
            keras.layers.RandomZoom(strength),
        ] if strength > 0 else None
        return model.fit(
            ds.train(batch_size=batch_size, augment=augment),
            validation_data=ds.val(batch_size=batch_size),
            *args,
            **kwargs,
        )


"""
## The search
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", default=None)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images-per-class", type=int, default=200)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="keras_datum_tuner_")
    source = args.source or make_shapes_dataset(
        os.path.join(workdir, "shapes"), images_per_class=args.images_per_class
    )
    tuner = keras_tuner.RandomSearch(
        DatumHyperModel(source, cache_dir=os.path.join(workdir, "cache")),
        objective="val_accuracy",
        max_trials=args.trials,
        directory=os.path.join(workdir, "tuner"),
        project_name="datum",
        overwrite=True,
        seed=1337,
    )
    tuner.search(epochs=args.epochs, verbose=2)
    best = tuner.get_best_hyperparameters(1)[0]
    print("Best hyperparameters:", best.values)


if __name__ == "__main__":
    main()
