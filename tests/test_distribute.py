"""Strategy and mixed-precision defaults, on 2 logical CPU devices."""

import json
import os
import subprocess
import sys
import textwrap
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_class_folders

from keras_datum import DatumDataset
from keras_datum import distribute


@pytest.fixture(autouse=True)
def restore_policy():
    before = keras.mixed_precision.global_policy().name
    yield
    keras.mixed_precision.set_global_policy(before)


MIRRORED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras
    from keras_datum import DatumDataset

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ds = DatumDataset(sys.argv[1], image_size=(16, 16), batch_size=4,
                      strategy=strategy, seed=0, verbose=False)
    x, _ = next(iter(ds.train()))
    batch = next(iter(strategy.experimental_distribute_dataset(ds.train())))
    replicas = [r.numpy() for r in strategy.experimental_local_results(batch[0])]
    with ds.strategy.scope():
        model = keras.Sequential([
            keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax"),
        ])
        model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(ds.train(), validation_data=ds.val(), epochs=1, verbose=0)
    sliced = ds.split("train[:50%]+val")
    model.fit(sliced, epochs=1, verbose=0)
    slice_replicas = [
        [int(r.shape[0]) for r in strategy.experimental_local_results(b[0])]
        for b in strategy.experimental_distribute_dataset(sliced)
    ]
    # "auto" first used inside a scope takes that strategy while it lasts only.
    auto = DatumDataset(sys.argv[1], image_size=(16, 16), batch_size=4, seed=0, verbose=False)
    with strategy.scope():
        auto_in_scope = int(next(iter(auto.train()))[0].shape[0])
    auto_after = int(next(iter(auto.train()))[0].shape[0])
    print(json.dumps({
        "auto_in_scope": auto_in_scope,
        "auto_after": auto_after,
        "replicas": ds.strategy.num_replicas_in_sync,
        "is_given": ds.strategy is strategy,
        "global_batch_size": ds.global_batch_size,
        "first_batch": int(x.shape[0]),
        "per_replica": [int(r.shape[0]) for r in replicas],
        "replicas_distinct": not np.array_equal(replicas[0], replicas[1]),
        "loss": history.history["loss"][0],
        "val_loss": history.history["val_loss"][0],
        "slice_replicas": slice_replicas,
        "slice_examples": sliced.num_examples,
    }))
    """
)


def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 12, "b": 12, "c": 12})
    result = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT, root],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["replicas"] == 2 and out["is_given"]
    assert out["global_batch_size"] == 8
    assert out["first_batch"] == 8
    assert out["per_replica"] == [4, 4]
    assert out["replicas_distinct"]
    assert out["loss"] > 0 and out["val_loss"] > 0
    assert (out["auto_in_scope"], out["auto_after"]) == (8, 4)
    # A slice is shared across the replicas as a whole split is.
    assert out["slice_replicas"][0] == [4, 4]
    assert sum(map(sum, out["slice_replicas"])) == out["slice_examples"]


JAX_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import keras
    import jax
    from jax._src import xla_bridge
    from keras_datum import DatumDataset, distribute

    # mixed_precision="auto" (the default) must not start JAX: that would
    # stop a later keras.distribution.initialize() from working.
    auto = DatumDataset(sys.argv[1], verbose=False).mixed_precision
    started_by_dataset = xla_bridge.backends_are_initialized()
    ds = DatumDataset(sys.argv[1], image_size=(16, 16), batch_size=4, seed=0,
                      verbose=False, mixed_precision="mixed_float16", image_dtype="uint8")
    model = keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2, activation="softmax", dtype="float32"),
    ])
    model.compile(keras.optimizers.Adam(0.1), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(ds.train(), epochs=30, verbose=0)
    x, _ = next(iter(ds.train()))
    _, accuracy = model.evaluate(ds.val(), verbose=0)
    print(json.dumps({
        "backend": keras.backend.backend(),
        "auto_before_start": auto,
        "started_by_dataset": started_by_dataset,
        "accelerators": distribute.accelerators(),
        "jax_platform": jax.devices()[0].platform,
        "policy": keras.mixed_precision.global_policy().name,
        "x_dtype": x.dtype.name,
        "epochs": len(history.history["loss"]),
        "accuracy": float(accuracy),
        "predicted": int(model.predict(ds.val(), verbose=0).shape[0]),
        "val": ds.num_examples["val"],
    }))
    """
)


@pytest.mark.slow
def test_fit_on_the_jax_backend(tmp_path):
    """ds.train() feeds model.fit on Keras's JAX backend (as on the GPU
    machine of benchmarks/gpu_fit.py): uint8 batches under mixed_float16 learn
    which class folder is dark and which light."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, (low, high) in {"dark": (0, 60), "light": (190, 256)}.items():
        os.makedirs(tmp_path / "src" / name)
        for i in range(15):
            pixels = rng.integers(low, high, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "src" / name / f"{i:03d}.png")
    result = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT, str(tmp_path / "src")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["backend"] == "jax"
    # Before JAX starts, auto leaves it alone (a JAX with no GPU plugin has
    # only the CPU); once it has started, auto asks JAX for its devices.
    assert out["started_by_dataset"] is False
    assert out["auto_before_start"] == "float32"
    assert out["accelerators"][0] == out["jax_platform"]
    assert out["policy"] == "mixed_float16"
    assert out["x_dtype"] == "uint8"
    assert out["epochs"] == 30
    assert out["predicted"] == out["val"] == 6
    assert out["accuracy"] == 1.0


def test_auto_strategy_without_gpus_is_the_default_strategy(class_folders):
    ds = DatumDataset(class_folders, batch_size=5, verbose=False)
    assert ds.strategy is tf.distribute.get_strategy()
    assert ds.global_batch_size == 5


def test_bad_strategy():
    with pytest.raises(ValueError, match="`strategy` must be 'auto' or a tf.distribute.Strategy instance. Received: strategy='mirrored'"):
        DatumDataset("/nonexistent", strategy="mirrored")


def test_bad_mixed_precision():
    with pytest.raises(ValueError, match="Received: mixed_precision='fp16'"):
        DatumDataset("/nonexistent", mixed_precision="fp16")


def test_auto_leaves_cpu_alone(class_folders):
    ds = DatumDataset(class_folders, verbose=False)
    assert ds.mixed_precision == "float32"
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.parametrize(
    "platform, capabilities, expected",
    [
        ("gpu", [(8, 0)], "mixed_float16"),
        ("gpu", [(9, 0), (7, 0)], "mixed_float16"),
        ("gpu", [(9, 0), (6, 1)], None),  # Every GPU must have tensor cores.
        ("gpu", [None], None),  # No CUDA capability (an AMD GPU on JAX).
        ("gpu", [], None),
        ("tpu", [], "mixed_bfloat16"),
        ("cpu", [], None),
        ("unknown", [], None),
    ],
)
def test_auto_policy_for_each_accelerator(platform, capabilities, expected):
    assert distribute.policy_for(platform, capabilities) == expected


def test_cuda_capability_as_jax_writes_it():
    assert distribute.cuda_capability("9.0") == (9, 0)
    assert distribute.cuda_capability("12.10") == (12, 10)
    assert distribute.cuda_capability("gfx90a") is None
    assert distribute.cuda_capability("") is None


def test_jax_devices_as_accelerators():
    def device(platform, capability=None):
        # The attributes auto reads from a `jax.Device`: no GPU here to list.
        return types.SimpleNamespace(platform=platform, compute_capability=capability)

    assert distribute.from_jax_devices([device("gpu", "8.0"), device("gpu", "9.0")]) == (
        "gpu", [(8, 0), (9, 0)]
    )
    assert distribute.from_jax_devices([device("gpu", "gfx90a")]) == ("gpu", [None])
    assert distribute.from_jax_devices([device("tpu")]) == ("tpu", [])
    assert distribute.from_jax_devices([device("cpu")]) == ("cpu", [])


def test_auto_warns_when_jax_has_not_started_its_accelerator(class_folders, monkeypatch):
    monkeypatch.setattr(distribute, "accelerators", lambda: ("unknown", []))
    with pytest.warns(UserWarning, match="Pass mixed_precision='mixed_float16'"):
        ds = DatumDataset(class_folders, mixed_precision="auto", verbose=False)
    assert ds.mixed_precision == "float32"


@pytest.mark.parametrize(
    "found, expected",
    [(("gpu", [(8, 0)]), "mixed_float16"), (("gpu", [(6, 1)]), "float32"), (("tpu", []), "mixed_bfloat16")],
)
def test_auto_sets_the_policy_it_picks(class_folders, monkeypatch, found, expected):
    monkeypatch.setattr(distribute, "accelerators", lambda: found)
    ds = DatumDataset(class_folders, mixed_precision="auto", verbose=False)
    assert ds.mixed_precision == expected
    assert keras.mixed_precision.global_policy().name == expected


def test_float32_leaves_the_policy_alone(class_folders, monkeypatch):
    monkeypatch.setattr(distribute, "accelerators", lambda: ("gpu", [(9, 0)]))
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    DatumDataset(class_folders, mixed_precision="float32", verbose=False)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"


def test_mixed_policy_images_travel_in_the_compute_dtype(class_folders):
    ds = DatumDataset(class_folders, image_size=(16, 16), mixed_precision="mixed_float16", verbose=False)
    assert keras.mixed_precision.global_policy().name == "mixed_float16"
    x_spec, y_spec = ds.train().element_spec
    assert x_spec.dtype == tf.float16 and y_spec.dtype == tf.int32
    model = keras.Sequential(
        [keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
         keras.layers.Dense(3), keras.layers.Activation("softmax", dtype="float32")]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(ds.train(), epochs=1, verbose=0)
    assert history.history["loss"][0] > 0


def test_file_auto_sharding_when_every_worker_can_get_shards(tmp_path, monkeypatch):
    import keras_datum.export as export_lib

    monkeypatch.setattr(export_lib, "MIN_EXAMPLES_PER_SHARD", 4)
    root = make_class_folders(tmp_path / "src", {"a": 20, "b": 20})
    ds = DatumDataset(root, validation_split=None, verbose=False)
    policy = ds.train().options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.FILE
    assert distribute.auto_shard_policy(ds.strategy, 0) == tf.data.experimental.AutoShardPolicy.DATA


def test_uint8_images_are_cast_by_the_model_under_a_mixed_policy(class_folders):
    ds = DatumDataset(
        class_folders, image_size=(16, 16), mixed_precision="mixed_float16", image_dtype="uint8", verbose=False
    )
    x_spec, _ = ds.train().element_spec
    assert x_spec.dtype == tf.uint8
    model = keras.Sequential(
        [keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
         keras.layers.Dense(3), keras.layers.Activation("softmax", dtype="float32")]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(ds.train(), validation_data=ds.val(), epochs=2, verbose=0)
    assert all(np.isfinite(history.history["loss"])) and history.history["loss"][0] > 0
    # The same model on the float16 batches gives the same outputs: the cast moved, nothing else.
    floats = DatumDataset(class_folders, image_size=(16, 16), mixed_precision="mixed_float16", verbose=False)
    np.testing.assert_allclose(
        model.predict(ds.val(), verbose=0), model.predict(floats.val(), verbose=0), rtol=1e-3, atol=1e-3
    )
