"""Hostile files in a source folder: FIFOs, device links, huge files, and
names that are not UTF-8. Each ends in a report or an error naming the file,
never in a hang or a runaway read."""

import io
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import warnings

import pytest
from conftest import make_class_folders
from detection_data import draw_items
from detection_data import write_coco
from detection_data import write_yolo

from keras_datum import DatumDataset
from keras_datum import notices
from keras_datum import storage

# Far longer than a tiny export takes, even on a loaded machine: reaching it
# means the export hung.
HANG_SECONDS = 120
# What the export of a tiny folder needs, with TensorFlow loaded; a runaway
# read (of /dev/zero, say) hits it in seconds instead of taking the machine.
MEMORY_LIMIT_BYTES = 2 * 2**30

_EXPORT_SCRIPT = """
import json, sys
from keras_datum import DatumDataset
ds = DatumDataset(sys.argv[1], image_size=(8, 8), batch_size=2, cache_dir=sys.argv[2],
                  verbose=False)
print(json.dumps(ds.num_examples))
"""


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _export_in_a_child(root, cache_dir):
    """Exports `root` in a child process that may neither hang nor grow
    without end; returns its `num_examples`."""
    # A session of its own, so that a hung child is killed with its workers.
    child = subprocess.Popen(
        [sys.executable, "-c", _EXPORT_SCRIPT, root, cache_dir],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_limit_memory, start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail(f"The export of {root!r} did not end within {HANG_SECONDS}s.")
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _reasons(cache_dir):
    with open(os.path.join(cache_dir, "invalid_files.json")) as f:
        return {entry["file"]: entry["reason"] for entry in json.load(f)}


def _call_within(seconds, function, fifos=()):
    """`function()`, failing the test instead of hanging when it takes longer
    than `seconds`; a reader stuck on one of `fifos` is then set free."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as e:  # Re-raised in the test's thread.
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:  # A writer that opens and closes: the reader sees EOF.
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"{function} did not return within {seconds}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_a_fifo_and_a_link_to_dev_zero_among_images_are_reported_not_read(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3})
    os.mkfifo(os.path.join(root, "a", "x.jpg"))
    os.symlink("/dev/zero", os.path.join(root, "b", "z.jpg"))
    cache_dir = str(tmp_path / "cache")
    counts = _export_in_a_child(root, cache_dir)
    assert sum(counts.values()) == 6
    reasons = _reasons(cache_dir)
    assert sorted(reasons) == ["a/x.jpg", "b/z.jpg"]
    assert "not a regular file (a FIFO)" in reasons["a/x.jpg"]
    assert "not a regular file (a character device)" in reasons["b/z.jpg"]


def test_a_file_over_the_size_bound_is_reported_by_name_with_the_variable(
    tmp_path, monkeypatch
):
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3}, size=(8, 8))
    make_class_folders(tmp_path / "big", {"c": 1}, size=(64, 64))
    os.replace(tmp_path / "big" / "c" / "000.png", os.path.join(root, "a", "big.png"))
    bound = os.path.getsize(os.path.join(root, "b", "000.png")) * 4
    assert os.path.getsize(os.path.join(root, "a", "big.png")) > bound
    # Read at each call: the forked export workers see it too.
    monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", str(bound))
    cache_dir = str(tmp_path / "cache")
    ds = DatumDataset(root, image_size=(8, 8), batch_size=2, cache_dir=cache_dir, verbose=False)
    with pytest.warns(UserWarning, match="1 invalid files were left out"):
        assert sum(ds.num_examples.values()) == 6
    reason = _reasons(cache_dir)["a/big.png"]
    assert f"over the bound of {bound} bytes" in reason
    assert "KERAS_DATUM_MAX_FILE_BYTES" in reason


def test_read_bytes_refuses_a_file_over_the_bound_naming_it(tmp_path, monkeypatch):
    path = tmp_path / "ten.bin"
    path.write_bytes(b"0123456789")
    monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", "10")
    assert storage.read_bytes(str(path)) == b"0123456789"
    monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", "9")
    with pytest.raises(OSError, match=r"ten\.bin'?: 10 bytes, over the bound of 9 bytes.*"
                                      "KERAS_DATUM_MAX_FILE_BYTES"):
        storage.read_bytes(str(path))
    with pytest.raises(OSError, match="ten.bin"):
        storage.open(str(path), "r")


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux's /proc")
def test_a_file_longer_than_stat_says_is_read_only_to_the_bound(tmp_path, monkeypatch):
    # /proc files say they hold 0 bytes, and have more: the read goes on
    # past what stat said, and must stop at the bound all the same.
    monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", "3")
    with pytest.raises(OSError, match="more than 3 bytes, over the bound of 3 bytes"):
        storage.read_bytes("/proc/self/environ")


def test_a_bad_size_bound_is_named_by_its_variable(tmp_path, monkeypatch):
    (tmp_path / "a.bin").write_bytes(b"a")
    for bad in ("0", "-5", "lots", "1.5"):
        monkeypatch.setenv("KERAS_DATUM_MAX_FILE_BYTES", bad)
        with pytest.raises(ValueError, match=f"Received: KERAS_DATUM_MAX_FILE_BYTES='{bad}'"):
            storage.read_bytes(str(tmp_path / "a.bin"))


def test_read_bytes_and_open_refuse_a_fifo_without_waiting_for_a_writer(tmp_path):
    fifo = str(tmp_path / "pipe.txt")
    os.mkfifo(fifo)
    reads = (storage.read_bytes, lambda p: storage.open(p, "r"), lambda p: storage.open(p, "rb"))
    for read in reads:
        with pytest.raises(OSError, match=r"pipe\.txt'?: not a regular file \(a FIFO\)"):
            _call_within(HANG_SECONDS, lambda: read(fifo), fifos=[fifo])


def test_a_link_to_a_regular_file_is_read_as_keras_reads_it(tmp_path):
    (tmp_path / "real.bin").write_bytes(b"bytes")
    os.symlink(tmp_path / "real.bin", tmp_path / "link.bin")
    assert storage.read_bytes(str(tmp_path / "link.bin")) == b"bytes"


def test_a_fifo_as_a_coco_annotation_file_is_refused_by_name(tmp_path):
    root = write_coco(tmp_path / "coco", {"train": draw_items(3)})
    annotation = os.path.join(root, "annotations", "instances_train.json")
    os.remove(annotation)
    os.mkfifo(annotation)

    def export():
        return DatumDataset(root, problem="detection", image_size=(8, 8),
                            cache_dir=str(tmp_path / "cache"), verbose=False).num_examples

    with pytest.raises(OSError, match=r"instances_train\.json'?: not a regular file \(a FIFO\)"):
        _call_within(HANG_SECONDS, export, fifos=[annotation])


# The folder layouts look for their annotation files with `storage.isfile`,
# which is False for a FIFO: today the file is skipped as if missing (a YOLO
# image then has no objects, a CSV layout is not seen). With the change
# these tests name, it is read, and refused by name.
def test_a_fifo_as_a_yolo_label_file_is_refused_by_name(tmp_path):
    root = write_yolo(tmp_path / "yolo", {"train": draw_items(3)})
    label = os.path.join(root, "labels", "train", "img001.txt")
    os.remove(label)
    os.mkfifo(label)

    def export():
        return DatumDataset(root, problem="detection", image_size=(8, 8),
                            cache_dir=str(tmp_path / "cache"), verbose=False).num_examples

    with pytest.raises(OSError, match=r"img001\.txt'?: not a regular file \(a FIFO\)"):
        _call_within(HANG_SECONDS, export, fifos=[label])


def test_a_fifo_named_train_csv_is_refused_by_name(tmp_path):
    root = make_class_folders(tmp_path / "src", {"train": 2})  # train/ beside train.csv
    os.mkfifo(os.path.join(root, "train.csv"))

    def export():
        return DatumDataset(root, image_size=(8, 8), cache_dir=str(tmp_path / "cache"),
                            verbose=False).num_examples

    with pytest.raises(OSError, match=r"train\.csv'?: not a regular file \(a FIFO\)"):
        _call_within(HANG_SECONDS, export, fifos=[os.path.join(root, "train.csv")])


def test_is_any_file_sees_a_fifo_that_isfile_does_not(tmp_path):
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    (tmp_path / "file").write_bytes(b"")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    assert storage.is_any_file(fifo) and not storage.isfile(fifo)
    assert storage.is_any_file(str(tmp_path / "file"))
    assert not storage.is_any_file(str(tmp_path))
    assert not storage.is_any_file(str(tmp_path / "dangling"))
    assert not storage.is_any_file(str(tmp_path / "missing"))


def _strict_stream(encoding):
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict")


@pytest.mark.parametrize(
    "encoding, name, shown",
    [
        ("utf-8", os.fsdecode(b"caf\xe9.jpg"), b"caf\\xe9.jpg"),
        ("ascii", "café.jpg", b"caf\\xe9.jpg"),
    ],
    ids=["undecodable_name_on_utf8", "unicode_name_on_ascii"],
)
def test_a_warning_naming_a_file_shows_on_a_strict_terminal(monkeypatch, encoding, name, shown):
    stderr = _strict_stream(encoding)
    monkeypatch.setattr(sys, "stderr", stderr)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notices.warn(f"{name} has no label file.")
    # Written to stderr as Python's default display writes it; must not raise.
    warning = caught[0]
    stderr.write(warnings.formatwarning(
        warning.message, warning.category, warning.filename, warning.lineno
    ))
    stderr.flush()
    assert shown + b" has no label file." in stderr.buffer.getvalue()


def test_printable_escapes_only_what_a_terminal_cannot_print():
    assert notices.printable("café/0001.jpg") == "café/0001.jpg"
    assert notices.printable(os.fsdecode(b"a/caf\xe9.jpg")) == "a/caf\\xe9.jpg"
    assert notices.printable("lone \ud800") == "lone \\ud800"
