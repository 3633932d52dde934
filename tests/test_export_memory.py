"""The export decodes one huge image at a time, in threads and in forked workers.

The huge images here are 2,000 x 2,000 PNGs (about 20 MB decoded) under a
threshold lowered to 8 MiB: the same code path as a 12,000 x 12,000 image
under the real one, at a fraction of the memory and time.
"""

import multiprocessing
import os
import threading
import time

import numpy as np
import pytest
from conftest import make_class_folders
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import encode
from keras_datum import export

BIG_SIDE = 2000
# Under an RGB PNG's estimate of 2,000 x 2,000 x 5 bytes (20 MB), over the
# 16 x 16 images' (kept as they are: 0).
LOW_THRESHOLD = 8 * 2**20
# How long an image inside the watched section waits for a second one to
# join it. Only a missing slot lets one in; with the slot each huge image
# waits this long alone, so the tests pass whatever the machine's speed.
COMPANY_WAIT_SECONDS = 0.5


def _big_png(path, seed):
    """A 2,000 x 2,000 RGB PNG: a pattern that compresses to a small file."""
    rows, columns = np.indices((BIG_SIDE, BIG_SIDE))
    pixels = np.stack([(rows ^ columns) & 255, (rows + seed) & 255, columns & 255], axis=-1)
    Image.fromarray(pixels.astype(np.uint8)).save(path)


def _source(tmp_path, big=4, small=12):
    root = make_class_folders(tmp_path / "src", {"small": small})
    os.makedirs(os.path.join(root, "big"))
    for i in range(big):
        _big_png(os.path.join(root, "big", f"{i}.png"), i)
    return root


class _Watch:
    """Counts the images inside `encode._converted` (which runs within the
    huge-image slot) in shared memory that forked workers inherit: how
    many entered, and the most inside at once."""

    def __init__(self):
        context = multiprocessing.get_context("fork")
        self.inside = context.Value("i", 0)
        self.most = context.Value("i", 0)
        self.entered = context.Value("i", 0)

    def wrap(self, converted):
        def watched(*args):
            with self.inside.get_lock():
                self.inside.value += 1
                self.entered.value += 1
                self.most.value = max(self.most.value, self.inside.value)
            try:
                self._wait_for_company()
                return converted(*args)
            finally:
                with self.inside.get_lock():
                    self.inside.value -= 1

        return watched

    def _wait_for_company(self):
        deadline = time.monotonic() + COMPANY_WAIT_SECONDS
        while self.inside.value < 2 and time.monotonic() < deadline:
            time.sleep(0.01)


@pytest.fixture
def watch(monkeypatch):
    monkeypatch.setattr(encode, "HUGE_IMAGE_BYTES", LOW_THRESHOLD)
    # Two workers on any machine (the process pool needs more than one).
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    # Four shards: each big image in its own, so both workers meet one.
    monkeypatch.setattr(export, "MIN_EXAMPLES_PER_SHARD", 4)
    watching = _Watch()
    monkeypatch.setattr(encode, "_converted", watching.wrap(encode._converted))
    return watching


def _export(root, cache_dir):
    ds = DatumDataset(root, image_size=(64, 64), validation_split=None, cache_dir=cache_dir,
                      verbose=False)
    ds.export()
    return ds


def test_forked_export_workers_decode_one_huge_image_at_a_time(tmp_path, monkeypatch, watch):
    monkeypatch.setattr(export, "PROCESS_POOL_MIN_EXAMPLES", 1)
    root = _source(tmp_path)
    ds = _export(root, tmp_path / "cache")
    assert watch.entered.value == 4  # Every big image was converted in a worker...
    assert watch.most.value == 1  # ...and never two at once.
    assert ds.num_examples == {"train": 16}
    assert ds.info["splits"]["train"]["image_sizes"]["width"]["max"] == 128  # Shrunk to the cap.


def test_export_threads_decode_one_huge_image_at_a_time(tmp_path, watch):
    root = _source(tmp_path)
    ds = _export(root, tmp_path / "cache")
    assert watch.entered.value == 4
    assert watch.most.value == 1
    assert ds.num_examples == {"train": 16}


def test_only_an_image_over_the_threshold_waits_for_the_huge_image_slot(tmp_path, monkeypatch):
    path = str(tmp_path / "big.png")
    _big_png(path, 0)
    results = []

    def encode_in_a_thread():
        thread = threading.Thread(target=lambda: results.append(encode.encode_image(path, 128)))
        thread.start()
        return thread

    with encode.shared_huge_image_slot():
        encode._huge_slot.acquire()  # Another worker's huge image.
        try:
            monkeypatch.setattr(encode, "HUGE_IMAGE_BYTES", 21 * 2**20)
            under = encode_in_a_thread()
            under.join(60)
            assert not under.is_alive() and len(results) == 1  # It did not wait.
            monkeypatch.setattr(encode, "HUGE_IMAGE_BYTES", LOW_THRESHOLD)
            over = encode_in_a_thread()
            over.join(COMPANY_WAIT_SECONDS)
            assert over.is_alive() and len(results) == 1  # It waits for the slot...
        finally:
            encode._huge_slot.release()
        over.join(60)
    assert not over.is_alive()  # ...and goes on once the slot is free.
    assert results[0] == results[1]
