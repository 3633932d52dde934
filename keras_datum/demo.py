"""The built-in demo: draw a shapes dataset, export it, train a small CNN.

Nothing is downloaded: the images are drawn procedurally (a coloured circle,
square or triangle on a noisy background of another colour).
"""

import contextlib
import fcntl
import os
import re
import shutil
import tempfile

import numpy as np
from PIL import Image
from PIL import ImageDraw

SHAPES = ("circle", "square", "triangle")
# The model's three 2x2 poolings need 8 pixels; the 20% validation carve
# gives each class a validation image from 3 images up.
MIN_IMAGE_SIZE = 8
MIN_IMAGES_PER_CLASS = 3


def draw_shape(shape, size, rng):
    """One RGB image of `shape` on a noisy background, as a PIL image."""
    background = rng.integers(0, 256, size=3)
    noise = rng.normal(0, 25, size=(size, size, 3))
    pixels = np.clip(background + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    # A foreground colour far from the background keeps the shape visible.
    colour = tuple(int(c) for c in (background + rng.integers(96, 160, size=3)) % 256)
    radius = rng.uniform(0.2, 0.35) * size
    cx, cy = rng.uniform(radius, size - radius, size=2)
    if shape == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    elif shape == "square":
        draw.rectangle([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    else:
        angle = rng.uniform(0, 2 * np.pi)
        points = [
            (cx + radius * np.cos(angle + k * 2 * np.pi / 3),
             cy + radius * np.sin(angle + k * 2 * np.pi / 3))
            for k in range(3)
        ]
        draw.polygon(points, fill=colour)
    return image


def make_shapes_dataset(directory, images_per_class=500, image_size=64, seed=0):
    """Writes `directory/<shape>/<n>.png`, one folder per shape class.

    Returns:
        `directory`.
    """
    rng = np.random.default_rng(seed)
    for shape in SHAPES:
        os.makedirs(os.path.join(directory, shape), exist_ok=True)
        for index in range(images_per_class):
            path = os.path.join(directory, shape, f"{index:05d}.png")
            draw_shape(shape, image_size, rng).save(path)
    return directory


def build_model(image_size, num_classes):
    import keras
    from keras import layers

    return keras.Sequential(
        [
            keras.Input((*image_size, 3)),
            layers.Rescaling(1.0 / 255),
            layers.Conv2D(16, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )


def run_demo(
    data_dir=None,
    cache_dir=None,
    images_per_class=500,
    image_size=64,
    epochs=20,
    seed=0,
    verbose=True,
):
    """Draws the shapes dataset (once), exports it, trains, returns val accuracy."""
    import keras

    from keras_datum import store
    from keras_datum.dataset import DatumDataset

    # Checked before anything is drawn.
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(
            f"`image_size` must be at least {MIN_IMAGE_SIZE} (the model pools three "
            f"times). Received: image_size={image_size}"
        )
    if images_per_class < MIN_IMAGES_PER_CLASS:
        raise ValueError(
            f"`images_per_class` must be at least {MIN_IMAGES_PER_CLASS}, so that "
            "validation gets one image of each class. "
            f"Received: images_per_class={images_per_class}"
        )
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
    else:
        data_dir = os.path.join(
            store.keras_home(), "datum-demo", f"shapes-{images_per_class}-{image_size}"
        )
    if not os.path.isdir(data_dir):
        _draw_into_place(data_dir, images_per_class, image_size, seed, verbose)
    keras.utils.set_random_seed(seed)
    ds = DatumDataset(
        data_dir,
        image_size=(image_size, image_size),
        batch_size=32,
        seed=seed,
        cache_dir=cache_dir,
        verbose=verbose,
    )
    if verbose:
        print(f"Classes: {ds.class_names}; examples: {ds.num_examples}")
    model = build_model((image_size, image_size), len(ds.class_names))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    # The dataset shuffles itself: Keras would warn that it ignores its own
    # `shuffle=True` for a tf.data.Dataset.
    model.fit(
        ds.train(), validation_data=ds.val(), epochs=epochs, shuffle=False,
        verbose=2 if verbose else 0,
    )
    _, accuracy = model.evaluate(ds.val(), verbose=0)
    if verbose:
        chance = 1 / len(ds.class_names)
        print(f"Validation accuracy: {accuracy:.3f} (chance: {chance:.3f})")
    return accuracy


# Written first into a drawing in progress, removed just before its rename:
# with it, a folder of the drawing's name is known to be a dead run's.
_DRAWING_MARK = ".keras_datum_demo_drawing"


def _draw_into_place(data_dir, images_per_class, image_size, seed, verbose):
    """Draws the dataset beside `data_dir` and renames it into place when
    complete: a run stopped halfway must not leave a folder that later runs
    would train on. The drawing has a folder of its own (never one of the
    user's, whatever its name), removed if the drawing fails; one left by a
    killed run is removed by the next."""
    parent, name = os.path.split(os.path.normpath(os.path.abspath(data_dir)))
    os.makedirs(parent, exist_ok=True)
    with _folder_lock(parent) as locked:
        if os.path.isdir(data_dir):
            return  # Another run drew it while this one waited.
        if locked:  # Otherwise a drawing in progress cannot be told from a dead one.
            _remove_dead_drawings(parent, name)
        if verbose:
            print(f"Drawing {images_per_class * len(SHAPES)} images into {data_dir}")
        partial = tempfile.mkdtemp(prefix=f"{name}.partial-", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(partial, 0o777 & ~umask)  # mkdtemp's 0700, as a plain mkdir.
        try:
            mark = os.path.join(partial, _DRAWING_MARK)
            open(mark, "w").close()
            make_shapes_dataset(partial, images_per_class, image_size, seed)
            os.remove(mark)
            try:
                os.rename(partial, data_dir)
            except OSError:
                if not os.path.isdir(data_dir):
                    raise
                # Another run drew it first (a file system without locks).
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # Gone after the rename.


@contextlib.contextmanager
def _folder_lock(folder):
    """Holds an exclusive lock on `folder` itself (no lock file is left);
    yields False where its file system has no locks."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)  # Closing releases the lock.


def _remove_dead_drawings(parent, name):
    """Removes drawings of `name` that killed runs left (call under the lock):
    a folder with mkdtemp's name for it and the mark inside."""
    drawing = re.compile(re.escape(name) + r"\.partial-[a-z0-9_]{8}")
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if drawing.fullmatch(entry) and os.path.isfile(os.path.join(path, _DRAWING_MARK)):
            shutil.rmtree(path, ignore_errors=True)
