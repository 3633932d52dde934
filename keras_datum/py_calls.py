"""Python that tf.data threads call (`tf.numpy_function`), and an exit of
the interpreter that never hangs on it.

A tf.data thread that calls into Python needs the GIL. As the
interpreter exits it destroys the iterators left in its modules while it
holds the GIL, and an iterator's destructor waits for its threads: one
of them waiting there for the GIL (or, once the interpreter finalizes,
stopped as it asks for it) hangs the exit for good. A decoding stream's
kept iterator (`epochs.Running`) reads its next epoch's records while
the last epoch ends, so a script that ended right after `model.fit`
with `cache=False` hung at exit in most runs.

Every function the read path hands `tf.numpy_function` goes through
`calls`: it counts the calls in flight. At exit (an `atexit` hook, which
runs before the interpreter finalizes, while threads can still take the
GIL) every call from then on returns at once (`when_exiting`: an error
the pipeline carries as a value, or an `InterpreterExitError`), and the
hook waits, the GIL released, until no call has run for `QUIET_S`: the
pipelines' buffers are full then, and no thread calls Python again while
their iterators are destroyed.
"""

import atexit
import functools
import threading
import time

# No call for this long: the pipelines have stopped asking (a decode in
# flight when the exit began has ended, and its next read returned at once).
QUIET_S = 0.5
# The exit waits no longer than this for them.
MAX_WAIT_S = 10.0
EXITING = "The Python interpreter is exiting: keras_datum's read path has stopped."

_lock = threading.Lock()
_state = {"exiting": False, "in_flight": 0, "last": 0.0}


class InterpreterExitError(RuntimeError):
    """Raised by a call of the read path once the interpreter exits."""


def calls(func, when_exiting=None):
    """`func`, to be called from tf.data threads: counted while it runs,
    and once the interpreter exits, `when_exiting(*args)` instead (or an
    `InterpreterExitError` without it)."""

    @functools.wraps(func)
    def call(*args):
        with _lock:
            _state["in_flight"] += 1
            exiting = _state["exiting"]
        try:
            if not exiting:
                return func(*args)
            if when_exiting is None:
                raise InterpreterExitError(EXITING)
            return when_exiting(*args)
        finally:
            with _lock:
                _state["in_flight"] -= 1
                _state["last"] = time.monotonic()

    return call


def _idle():
    with _lock:
        return _state["in_flight"] == 0 and time.monotonic() - _state["last"] >= QUIET_S


def settle(max_wait=MAX_WAIT_S):
    """Stops the read path's calls into Python and waits until none has
    run for `QUIET_S` (at most `max_wait` seconds); True once none runs.
    Registered with `atexit`."""
    with _lock:
        _state["exiting"] = True
    deadline = time.monotonic() + max_wait
    while not _idle():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


atexit.register(settle)
