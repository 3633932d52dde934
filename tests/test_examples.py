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
        "--epochs", "1", "--fine-tune-epochs", "1", "--uint8", "--random-resized-crop",
    )
    assert "Images arrive as uint8" in out
    assert "Validation accuracy:" in out


@pytest.mark.slow
def test_resume_after_a_kill(tmp_path):
    args = ["--images-per-class", "20", "--image-size", "16", "--workdir", str(tmp_path)]
    killed = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "resume.py"), *args,
         "--kill-at-step", "5"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "Starting from scratch" in killed.stdout
    out = _run("resume.py", *args)
    # 48 training images in batches of 16: 3 steps an epoch; the backup
    # every 2 steps was made after step 4, the middle of epoch 1.
    assert "Resuming after epoch 1, batch 0" in out
    assert "Epochs run in this process: 2" in out
    assert "Validation accuracy:" in out
