"""keras_datum: image folders as validated, cached TFRecords for `model.fit`.

The public names are imported on first use (PEP 562), so that importing the
package (the `keras-datum` command does) does not start TensorFlow before the
command has chosen how it starts (see `cli.start_tensorflow_quietly`).
"""

import importlib

from keras_datum.version import __version__

# Each public name, and the module that defines it.
_PUBLIC = {
    "CacheError": "keras_datum.cache",
    "DatumDataset": "keras_datum.dataset",
    "InvalidImageError": "keras_datum.errors",
    "PROBLEM_NAMES": "keras_datum.problems",
}

__all__ = [
    "PROBLEM_NAMES",
    "CacheError",
    "DatumDataset",
    "InvalidImageError",
    "__version__",
    "callbacks",
]


# Public modules, imported on first use too.
_MODULES = ("callbacks",)


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"keras_datum.{name}")
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value  # Looked up once.
        return value
    raise AttributeError(f"module 'keras_datum' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
