"""
Title: Transfer learning with EfficientNetB0 on a keras_datum dataset
Description: The original Datum notebook's transfer-learning recipe, on a folder of images.

## Introduction

Datum's notebook fine-tuned an ImageNet-pretrained EfficientNetB0 on a TFRecord
export. Here the export comes from `DatumDataset`, and the weights come from a flag:
`--weights imagenet` downloads them (where downloads are possible), and the default,
`--weights None`, starts from random weights so the example runs offline.

Run: `python examples/transfer_learning.py [--source DIR] [--weights imagenet] [--uint8]
[--random-resized-crop]`.
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
parser.add_argument(
    "--uint8", action="store_true",
    help="hand the model uint8 batches, cast on the accelerator (image_dtype='uint8')",
)
parser.add_argument(
    "--random-resized-crop", action="store_true",
    help="train on ImageNet-style random crops, each decoded within its window alone",
)
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
# With `--uint8`, batches leave the pipeline as uint8 pixels (a quarter of
# float32's bytes to copy to a GPU) and the model's float32 `keras.Input` casts
# them: worth it when the host CPU, not the accelerator, limits training.
ds = DatumDataset(
    source, image_size=size, batch_size=16, seed=1337,
    image_dtype="uint8" if args.uint8 else None,
)
print("Classes:", ds.class_names, "examples:", ds.num_examples)
print("Images arrive as", ds.train().element_spec[0].dtype.name)

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

"""
With `--random-resized-crop`, training sees torchvision's `RandomResizedCrop` of
each image (8% to 100% of its area, aspect ratio 3/4 to 4/3), resized to
`image_size`: each JPEG is decoded within its window alone, so the crop costs less
than a full decode (docs/augmentation.md). Validation sees whole images.
"""

crop = True if args.random_resized_crop else None
model.fit(ds.train(random_resized_crop=crop), validation_data=ds.val(), epochs=args.epochs,
          verbose=2)

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
model.fit(ds.train(random_resized_crop=crop), validation_data=ds.val(),
          epochs=args.fine_tune_epochs, verbose=2)
_, accuracy = model.evaluate(ds.val(), verbose=0)
print(f"Validation accuracy: {accuracy:.3f}")
