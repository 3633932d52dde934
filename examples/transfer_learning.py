"""
Title: Transfer learning with EfficientNetB0 on a keras_datum dataset
Description: The original Datum notebook's transfer-learning recipe, on a folder of images.

## Introduction

Datum's notebook fine-tuned an ImageNet-pretrained EfficientNetB0 on a TFRecord
export. Here the export comes from `DatumDataset`, and the weights come from a flag:
`--weights imagenet` downloads them (where downloads are possible), and the default,
`--weights None`, starts from random weights so the example runs offline.

Run: `python examples/transfer_learning.py [--source DIR] [--weights imagenet]`.
Without `--source` it draws the demo's shapes dataset.
"""

import argparse
import os
import tempfile

import keras

from keras_datum import DatumDataset
from keras_datum.demo import make_shapes_dataset

parser = argparse.ArgumentParser()
parser.add_argument("--source", default=None, help="a class-folder image dataset")
parser.add_argument("--weights", default="None", help="'imagenet' or None")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--images-per-class", type=int, default=100)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--fine-tune-epochs", type=int, default=1)
args = parser.parse_args()
weights = None if args.weights in ("None", "none", "") else args.weights

"""
## The data
"""

source = args.source
if source is None:
    source = make_shapes_dataset(
        os.path.join(tempfile.mkdtemp(prefix="keras_datum_tl_"), "shapes"),
        images_per_class=args.images_per_class,
        image_size=96,
    )
size = (args.image_size, args.image_size)
ds = DatumDataset(source, image_size=size, batch_size=16, seed=1337)
print("Classes:", ds.class_names, "examples:", ds.num_examples)

"""
## The model

EfficientNet in Keras includes its own input scaling and expects pixels in
[0, 255]: exactly what `DatumDataset` yields, so no `Rescaling` layer is needed.
First the base is frozen and only the new head trains.
"""

base = keras.applications.EfficientNetB0(
    include_top=False, weights=weights, input_shape=(*size, 3)
)
base.trainable = False
inputs = keras.Input((*size, 3))
x = base(inputs, training=False)
x = keras.layers.GlobalAveragePooling2D()(x)
x = keras.layers.Dropout(0.2)(x)
outputs = keras.layers.Dense(len(ds.class_names), activation="softmax")(x)
model = keras.Model(inputs, outputs)
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)
model.fit(ds.train(), validation_data=ds.val(), epochs=args.epochs, verbose=2)

"""
## Fine-tuning

Then the top 20 layers are unfrozen (BatchNormalization stays frozen, as the Keras
guide recommends) and trained with a small learning rate.
"""

for layer in base.layers[-20:]:
    if not isinstance(layer, keras.layers.BatchNormalization):
        layer.trainable = True
model.compile(
    optimizer=keras.optimizers.Adam(1e-5),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)
model.fit(ds.train(), validation_data=ds.val(), epochs=args.fine_tune_epochs, verbose=2)
_, accuracy = model.evaluate(ds.val(), verbose=0)
print(f"Validation accuracy: {accuracy:.3f}")
