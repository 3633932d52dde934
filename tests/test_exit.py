"""A script that reads a stream and ends exits, however busy the stream's
iterators still are (see `keras_datum.py_calls`): in real subprocesses."""

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_datum import py_calls

# Left at module level, as a script leaves them: the interpreter destroys
# them as it exits, while a decoding stream's kept iterator reads on.
CHILD = """
import sys
from keras_datum import DatumDataset
dataset = DatumDataset(sys.argv[1], image_size=(224, 224), batch_size=8, cache=False,
                       cache_dir=sys.argv[2], verbose=False)
iterator = iter(dataset.train())
if sys.argv[3] == "epoch":
    seen = sum(int(x.shape[0]) for x, y in iterator)
else:
    seen = int(next(iterator)[0].shape[0])
print("read", seen, flush=True)
"""


def _photos(root, count=48):
    rng = np.random.default_rng(0)
    for index in range(count):
        folder = os.path.join(root, "ab"[index % 2])
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, (360, 480, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{index}.jpg"), quality=90)
    return str(root)


@pytest.mark.slow
def test_script_exits_while_its_stream_reads_on(tmp_path):
    source, cache = _photos(tmp_path / "src"), str(tmp_path / "cache")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # Before `py_calls`, most such exits hung (4 of 6 after an epoch).
    for how in ("epoch", "epoch", "batch", "epoch", "batch"):
        result = subprocess.run(
            [sys.executable, "-c", CHILD, source, cache, how], check=False, capture_output=True,
            text=True, timeout=120, env=env,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split()[:1] == ["read"], result.stdout


def test_calls_count_and_pass_through():
    seen = []
    call = py_calls.calls(lambda x: seen.append(x) or x * 2, lambda x: -1)
    assert call(3) == 6 and seen == [3]
    assert py_calls._state["in_flight"] == 0
    with pytest.raises(ZeroDivisionError):
        py_calls.calls(lambda: 1 / 0)()
    assert py_calls._state["in_flight"] == 0


def test_calls_return_at_once_after_the_exit_began():
    code = (
        "from keras_datum import py_calls\n"
        "read = py_calls.calls(lambda x: x, lambda x: 'exiting')\n"
        "claim = py_calls.calls(lambda: 1)\n"
        "assert py_calls.settle(max_wait=5)\n"
        "assert read(1) == 'exiting'\n"
        "try:\n"
        "    claim()\n"
        "except py_calls.InterpreterExitError:\n"
        "    print('refused')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "refused"
