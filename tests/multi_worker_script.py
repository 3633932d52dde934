"""One worker of the multi-worker test (run by test_multi_worker.py with TF_CONFIG set).

Usage: python multi_worker_script.py SOURCE CACHE_DIR OUTPUT_JSON
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# The strategy first: it must start before anything else touches the runtime.
strategy = tf.distribute.MultiWorkerMirroredStrategy()

from keras_datum import DatumDataset  # noqa: E402


def main(source, cache_dir, output):
    ds = DatumDataset(
        source,
        image_size=(16, 16),
        batch_size=4,
        strategy=strategy,
        validation_split=None,
        shuffle=False,
        verbose=False,
    )
    try:
        ds.train(data_service="grpc://localhost:5050")
        data_service_refused = ""
    except ValueError as e:
        data_service_refused = str(e)
    train = ds.train()
    # Every label is the example's id: collect the ids this worker's replicas got.
    seen = []
    for _, y in train:
        for local in strategy.experimental_local_results(y):
            seen += np.asarray(local).ravel().tolist()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((16, 16, 3)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(1),
            ]
        )
        optimizer = keras.optimizers.SGD(0.01)
    # A custom training step: Keras 3's `model.fit` fails under
    # MultiWorkerMirroredStrategy before the first step (keras-team/keras#20585),
    # whatever the input.
    global_batch = ds.global_batch_size

    @tf.function
    def train_step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                errors = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1)
                loss = tf.nn.compute_average_loss(errors, global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce("SUM", losses, axis=None)

    losses = [float(train_step(x, y)) for x, y in ds.train()]
    result = {
        "seen": seen,
        "is_distributed": isinstance(train, tf.distribute.DistributedDataset),
        "num_replicas": strategy.num_replicas_in_sync,
        "global_batch_size": ds.global_batch_size,
        "train_shards": len(ds.info["splits"]["train"]["shards"]),
        "steps": len(losses),
        "loss": losses[-1],
        # Every worker would read a whole epoch from its own service job.
        "data_service_refused": data_service_refused,
    }
    with open(output, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
