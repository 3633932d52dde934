"""tf.data service: a real dispatcher and two workers on loopback, in this process."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_class_folders

from keras_datum import DatumDataset
from keras_datum import export


@pytest.fixture(scope="module")
def service():
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0)
    )
    address = dispatcher.target.split("://")[1]
    workers = [
        tf.data.experimental.service.WorkerServer(
            tf.data.experimental.service.WorkerConfig(dispatcher_address=address, port=0)
        )
        for _ in range(2)
    ]
    yield dispatcher.target
    for worker in workers:
        worker.stop()
    dispatcher.stop()


def test_every_example_arrives_exactly_once_and_fit_runs(tmp_path, monkeypatch, service):
    monkeypatch.setattr(export, "MIN_EXAMPLES_PER_SHARD", 4)
    root = make_class_folders(tmp_path / "src", {"a": 20, "b": 20, "c": 20})
    ds = DatumDataset(root, image_size=(16, 16), batch_size=4, validation_split=None, verbose=False)
    assert len(ds.info["splits"]["train"]["shards"]) > 2
    local = collections.Counter(x.tobytes() for x, _ in
                                ((np.asarray(x), y) for x, y in ds.train(batch_size=None)))
    remote = collections.Counter()
    for x, _ in ds.train(data_service=service):
        for image in np.asarray(x):
            remote[image.tobytes()] += 1
    assert remote == local
    assert sum(remote.values()) == 60
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds.train(data_service=service), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
