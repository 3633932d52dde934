"""keras_datum: image folders as validated, cached TFRecords for `model.fit`."""

from keras_datum.cache import CacheError
from keras_datum.dataset import DatumDataset
from keras_datum.errors import InvalidImageError
from keras_datum.problems import PROBLEM_NAMES
from keras_datum.version import __version__

__all__ = [
    "PROBLEM_NAMES",
    "CacheError",
    "DatumDataset",
    "InvalidImageError",
    "__version__",
]
