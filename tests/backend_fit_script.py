"""Run in a subprocess with KERAS_BACKEND set (see test_backends.py): fits a
classifier and a KerasHub detector on DatumDatasets, prints a JSON line."""

import json
import os
import sys

import tensorflow as tf

# A spy on the real call (it still runs): the dataset must hide the GPUs from
# TensorFlow on JAX and PyTorch, before TensorFlow starts, and not on its own
# backend.
calls = []
real_set_visible_devices = tf.config.set_visible_devices


def recording(devices, device_type=None):
    calls.append((list(devices), device_type))
    return real_set_visible_devices(devices, device_type)


tf.config.set_visible_devices = recording

import keras  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_class_folders  # noqa: E402
from detection_data import draw_items  # noqa: E402
from detection_data import write_voc  # noqa: E402
from test_keras_hub import _tiny_retinanet  # noqa: E402

from keras_datum import DatumDataset  # noqa: E402

tmp = sys.argv[1]
if os.environ.get("DATA_PARALLEL"):
    keras.distribution.set_distribution(keras.distribution.DataParallel())
classes = make_class_folders(os.path.join(tmp, "classes"), {"a": 8, "b": 8}, size=(16, 16))
ds = DatumDataset(classes, image_size=(16, 16), batch_size=4, cache_dir=os.path.join(tmp, "c1"),
                  verbose=False)
hidden = list(calls)
tf_started_on_gpu = bool(tf.config.get_visible_devices("GPU"))
model = keras.Sequential([
    keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
    keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(2, activation="softmax"),
])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
classifier = model.fit(ds.train(), validation_data=ds.val(), epochs=2, shuffle=False, verbose=0)

voc = write_voc(os.path.join(tmp, "voc"), draw_items(8, size=(64, 64), boxes_in=lambda i: 1 + i % 2))
boxes = DatumDataset(voc, image_size=(64, 64), batch_size=4, max_boxes=4,
                     cache_dir=os.path.join(tmp, "c2"), verbose=False)
detector = _tiny_retinanet(len(boxes.class_names))
augment = [keras.layers.RandomFlip("horizontal", bounding_box_format="xyxy")]
detection = detector.fit(boxes.train(augment=augment), validation_data=boxes.val(), epochs=1,
                         shuffle=False, verbose=0)
print(json.dumps({
    "backend": keras.backend.backend(),
    "hidden": hidden,
    "tf_visible_gpus": tf_started_on_gpu,
    "distribution": type(keras.distribution.distribution()).__name__,
    "strategy_replicas": ds.strategy.num_replicas_in_sync,
    "policy": ds.mixed_precision,
    "classifier": {k: [float(v) for v in vs] for k, vs in classifier.history.items()},
    "detector": {k: [float(v) for v in vs] for k, vs in detection.history.items()},
}))
