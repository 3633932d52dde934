import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402


@pytest.fixture(autouse=True)
def keras_home(tmp_path, monkeypatch):
    """Every test gets its own Keras home, so default caches never collide."""
    home = tmp_path / "keras_home"
    monkeypatch.setenv("KERAS_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def no_global_seed_left_behind():
    """A test that sets TensorFlow's global seed (the demo calls
    keras.utils.set_random_seed) clears it, so later tests read unseeded."""
    yield
    import tensorflow as tf

    if tf.compat.v1.random.get_seed(None)[0] is not None:
        tf.random.set_seed(None)


def random_image(rng, size=(16, 16), mode="RGB"):
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    shape = (*size, channels) if channels > 1 else size
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)


def make_class_folders(root, counts, size=(16, 16), seed=0, ext="png"):
    """Writes `root/<class>/<i>.<ext>` noise images; returns root."""
    rng = np.random.default_rng(seed)
    for name, count in counts.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(count):
            random_image(rng, size).save(os.path.join(root, name, f"{i:03d}.{ext}"))
    return str(root)


@pytest.fixture
def class_folders(tmp_path):
    return make_class_folders(tmp_path / "src", {"cat": 10, "dog": 10, "bird": 10})
