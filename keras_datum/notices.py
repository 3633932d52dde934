"""Warnings named from the user's line.

A fixed `stacklevel` points at the user's code from one call path only: the
same export runs from `train()`, `val()`, `num_examples` or `summary()`, each
a different depth down. `warn` counts the frames inside this package instead.
"""

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message, category=UserWarning):
    """`warnings.warn(message)` from the first caller outside keras_datum."""
    frame, stacklevel = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, category, stacklevel=stacklevel)
