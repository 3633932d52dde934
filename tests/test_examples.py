"""The examples run end to end, shrunk."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script, *args):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_quickstart(tmp_path):
    out = _run(
        "quickstart.py", "--images-per-class", "10", "--image-size", "32",
        "--epochs", "1", "--workdir", str(tmp_path),
    )
    assert "Classes: ['circle', 'square', 'triangle']" in out
    assert "Validation accuracy:" in out


@pytest.mark.slow
def test_transfer_learning_offline(tmp_path):
    out = _run(
        "transfer_learning.py", "--images-per-class", "6", "--image-size", "64",
        "--epochs", "1", "--fine-tune-epochs", "1", "--uint8",
    )
    assert "Images arrive as uint8" in out
    assert "Validation accuracy:" in out
