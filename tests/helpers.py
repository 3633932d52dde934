"""Test helpers that read what an export wrote, straight from the shards."""

import os

import numpy as np
import tensorflow as tf


def read_split(ds, split):
    """[(filename, label or None, decoded uint8 pixels)] of one split, in shard order."""
    meta = ds.info
    rows = []
    for shard in meta["splits"][split]["shards"]:
        path = os.path.join(ds.cache_dir, shard["file"])
        for raw in tf.data.TFRecordDataset(path):
            example = tf.train.Example.FromString(raw.numpy())
            feature = example.features.feature
            name = feature["source/filename"].bytes_list.value[0].decode()
            label = list(feature["label"].int64_list.value) if "label" in feature else None
            pixels = tf.io.decode_image(
                feature["image"].bytes_list.value[0], expand_animations=False
            ).numpy()
            rows.append((name, label, pixels))
    return rows


def filenames(ds, split):
    return [name for name, _, _ in read_split(ds, split)]


def shard_stats(ds):
    """{file: (inode, mtime_ns)} of the cache's shards."""
    out = {}
    for name in os.listdir(ds.cache_dir):
        if name.endswith(".tfrecord"):
            stat = os.stat(os.path.join(ds.cache_dir, name))
            out[name] = (stat.st_ino, stat.st_mtime_ns)
    return out


def fit_one_epoch(ds, input_shape):
    """Trains a tiny CNN on `ds.train()` for one epoch, validating on `ds.val()`;
    checks the loss is finite and validation ran."""
    import keras

    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(len(ds.class_names), activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(ds.train(), validation_data=ds.val(), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert "val_accuracy" in history.history


def unbatched(dataset):
    return [(np.asarray(x), np.asarray(y)) for x, y in dataset.unbatch()]
