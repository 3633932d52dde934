"""`model.fit(ds.train(), validation_data=ds.val())` on each Keras backend, in
real subprocesses, for a classifier and a KerasHub detector."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "backend_fit_script.py")


def _fit(tmp_path, backend, **env):
    environ = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    result = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True,
        timeout=900, env=environ,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _check_fits(out):
    for history in (out["classifier"], out["detector"]):
        for name in ("loss", "val_loss"):
            assert len(history[name]) >= 1 and np.isfinite(history[name]).all(), history
    assert out["classifier"]["loss"][-1] > 0 and out["detector"]["loss"][0] > 0


BACKENDS = [
    "tensorflow",
    "jax",
    pytest.param("torch", marks=pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="PyTorch is not installed (its wheel pulls CUDA's; see docs/distribution.md)",
    )),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_classifier_and_a_detector_fit_on_each_backend(tmp_path, backend):
    out = _fit(tmp_path, backend)
    assert out["backend"] == backend
    _check_fits(out)
    if backend == "tensorflow":
        # TensorFlow trains: its GPUs stay its own.
        assert out["hidden"] == []
    else:
        # tf.data runs on the CPU: the GPUs are hidden from TensorFlow before
        # it starts, so that it takes none of the memory the backend needs.
        assert out["hidden"] == [[[], "GPU"]] and out["tf_visible_gpus"] is False
    assert out["strategy_replicas"] == 1
    # mixed_precision="auto" asked the backend itself: a CPU, so no change.
    assert out["policy"] == "float32"


@pytest.mark.slow
def test_jax_data_parallel_over_two_devices_reads_global_batches(tmp_path):
    out = _fit(tmp_path, "jax", DATA_PARALLEL="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert out["distribution"] == "DataParallel"
    _check_fits(out)


def test_a_tf_distribute_strategy_is_refused_on_another_backend(tmp_path):
    code = (
        "import tensorflow as tf\n"
        "from keras_datum import DatumDataset\n"
        "try:\n"
        "    DatumDataset('.', strategy=tf.distribute.OneDeviceStrategy('/cpu:0'))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert "A tf.distribute strategy distributes Keras's TensorFlow backend only, and " \
           "Keras runs on jax" in result.stdout, result.stderr[-2000:]
