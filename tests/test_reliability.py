"""Crash safety, concurrent first use, damaged caches, hostile files (real processes, real bytes)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import tensorflow as tf
import pytest
from conftest import make_class_folders
from helpers import read_split
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}

EXPORT_SCRIPT = textwrap.dedent(
    """
    import sys
    from keras_datum import DatumDataset
    DatumDataset(sys.argv[1], cache_dir=sys.argv[2], verbose=False).export()
    print("done", flush=True)
    """
)


def _expected(root):
    """{relative path: (label, pixels)} straight from the source folder."""
    classes = sorted(os.listdir(root))
    out = {}
    for label, name in enumerate(classes):
        for file in os.listdir(os.path.join(root, name)):
            out[f"{name}/{file}"] = (label, np.asarray(Image.open(os.path.join(root, name, file))))
    return out


def _check_complete(root, cache_dir):
    ds = DatumDataset(root, cache_dir=cache_dir, verbose=False)
    expected = _expected(root)
    seen = {}
    for split in ("train", "val"):
        for name, label, pixels in read_split(ds, split):
            seen[name] = (label, pixels)
    assert sorted(seen) == sorted(expected)
    for name, (label, pixels) in seen.items():
        assert label == [expected[name][0]]
        np.testing.assert_array_equal(pixels, expected[name][1])
    return ds


def _wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def _temporary_folders(parent):
    return [n for n in os.listdir(parent) if ".tmp-" in n]


def _shard_bytes(parent):
    total = 0
    for name in _temporary_folders(parent):
        folder = os.path.join(parent, name)
        try:
            total += sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        except FileNotFoundError:
            pass
    return total


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["started", "writing", "half_written"])
def test_sigkill_mid_export_then_next_use_rebuilds_complete(tmp_path, kill_at):
    root = make_class_folders(tmp_path / "src", {"a": 150, "b": 150}, size=(64, 64))
    cache_dir = str(tmp_path / "cache")
    child = subprocess.Popen([sys.executable, "-c", EXPORT_SCRIPT, root, cache_dir], env=ENV,
                             stdout=subprocess.PIPE, text=True)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root) for f in fs)
    conditions = {
        "started": lambda: bool(_temporary_folders(tmp_path)),
        "writing": lambda: _shard_bytes(tmp_path) > 0,
        "half_written": lambda: _shard_bytes(tmp_path) > total // 2,
    }
    reached = _wait_for(conditions[kill_at])
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert reached, f"the export never reached {kill_at!r}"
    # Killed mid-way: nothing under the final name, so nothing can be trusted.
    assert not os.path.exists(os.path.join(cache_dir, "metadata.json"))
    ds = _check_complete(root, cache_dir)
    assert sum(ds.num_examples.values()) == 300
    assert not _temporary_folders(tmp_path), "leftover temporary folders are cleaned up"


@pytest.mark.slow
def test_four_processes_export_once_and_read_identical_data(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 60, "b": 60}, size=(32, 32))
    cache_dir = str(tmp_path / "cache")
    log = str(tmp_path / "exports.log")
    script = textwrap.dedent(
        f"""
        import json, os, sys, hashlib
        from keras_datum import DatumDataset, export
        real = export.export_layout
        def logged(*args, **kwargs):
            with open({log!r}, "a") as f:
                f.write(str(os.getpid()) + "\\n")
            return real(*args, **kwargs)
        export.export_layout = logged
        ds = DatumDataset({root!r}, cache_dir={cache_dir!r}, image_size=(32, 32), verbose=False)
        digest = hashlib.sha256()
        for x, y in ds.val(batch_size=None):
            digest.update(x.numpy().tobytes() + y.numpy().tobytes())
        print(json.dumps({{"created": ds.info["created"], "val": digest.hexdigest(),
                           "counts": ds.num_examples}}))
        """
    )
    children = [
        subprocess.Popen([sys.executable, "-c", script], env=ENV, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = []
    for child in children:
        out, _ = child.communicate(timeout=300)
        assert child.returncode == 0
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    with open(log) as f:
        assert len(f.read().split()) == 1, "exactly one process exported"
    assert all(o == outputs[0] for o in outputs)
    assert outputs[0]["counts"] == {"train": 96, "val": 24}


def _flip_a_byte(path, offset_fraction=0.5):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        index = int(len(data) * offset_fraction)
        data[index] ^= 0xFF
        f.seek(0)
        f.write(data)


def _one_shard_dataset(tmp_path, cache_dir=None):
    root = make_class_folders(tmp_path / "src", {"a": 10, "b": 10})
    ds = DatumDataset(root, validation_split=None, image_size=(16, 16), cache_dir=cache_dir, verbose=False)
    ds.export()
    (shard,) = [n for n in os.listdir(ds.cache_dir) if n.endswith(".tfrecord")]
    return root, ds, os.path.join(ds.cache_dir, shard)


def test_verify_names_a_shard_with_a_flipped_byte(tmp_path, capsys):
    root, ds, shard = _one_shard_dataset(tmp_path)
    assert cli.main(["verify", ds.cache_dir]) == 0
    assert "OK:" in capsys.readouterr().out
    _flip_a_byte(shard)
    assert cli.main(["verify", root]) == 1
    out = capsys.readouterr().out
    # TensorFlow's own words, without the op they came from.
    assert re.search(
        rf"DAMAGED: {re.escape(shard)}: damaged after \d+ of 20 records \(corrupted record at \d+\)\.\n", out
    ), out


def test_verify_finds_a_missing_shard_and_bad_metadata(tmp_path, capsys):
    _, ds, shard = _one_shard_dataset(tmp_path)
    os.remove(shard)
    assert cli.main(["verify", ds.cache_dir]) == 1
    assert "shard listed in the metadata is missing" in capsys.readouterr().out
    with open(os.path.join(ds.cache_dir, "metadata.json"), "w") as f:
        f.write("{}")
    assert cli.main(["verify", ds.cache_dir]) == 1
    assert "metadata.json' is invalid" in capsys.readouterr().out


# A cache folder whose name holds glob characters is checked all the same.
@pytest.mark.parametrize("cache,folder", [(True, None), (False, None), (False, "run[1]*?")])
def test_reading_a_damaged_shard_names_it(tmp_path, cache, folder):
    cache_dir = folder and tmp_path / folder
    root, _, shard = _one_shard_dataset(tmp_path, cache_dir)
    _flip_a_byte(shard)
    ds = DatumDataset(root, validation_split=None, image_size=(16, 16), reexport="never",
                      cache=cache, cache_dir=cache_dir, verbose=False)
    with pytest.raises(Exception, match=rf"Shard {re.escape(shard)} is damaged"):
        for _ in ds.train():
            pass


@pytest.mark.parametrize("cache", [True, False])
def test_a_shard_with_more_records_than_its_metadata_names_it(tmp_path, cache):
    """Records past the count reach the split's own count check (which names
    no file) unless the shard's check fires first."""
    root, _, shard = _one_shard_dataset(tmp_path)
    records = [r.numpy() for r in tf.data.TFRecordDataset(shard)]
    with tf.io.TFRecordWriter(shard) as writer:
        for record in records + records[:2]:
            writer.write(record)
    ds = DatumDataset(root, validation_split=None, image_size=(16, 16), reexport="never",
                      cache=cache, verbose=False)
    with pytest.raises(Exception, match=rf"Shard {re.escape(shard)} is damaged: it yielded 22 of its 20 records"):
        for _ in ds.train(batch_size=1, shuffle=False):
            pass


def test_source_is_never_modified(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 5, "b": 5})
    (tmp_path / "src" / "a" / "bad.jpg").write_bytes(b"junk")

    def snapshot():
        out = {}
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                stat = os.stat(path)
                with open(path, "rb") as f:
                    out[path] = (f.read(), stat.st_mtime_ns, stat.st_mode)
        return out, sorted(os.listdir(root))

    before = snapshot()
    with pytest.warns(UserWarning):
        DatumDataset(root, verbose=False).export()
    assert snapshot() == before


def _mount_tmpfs(path, size, read_only=False):
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    return path


@pytest.fixture
def mounts():
    mounted = []

    def mount(path, size, read_only=False):
        mounted.append(_mount_tmpfs(path, size, read_only))
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_disk_full_gives_a_clean_error_and_no_leftovers(tmp_path, mounts):
    root = make_class_folders(tmp_path / "src", {"a": 40, "b": 40}, size=(64, 64))
    small = mounts(tmp_path / "small", "64k")
    cache_dir = small / "cache"
    with pytest.raises(OSError, match=re.escape(str(small))):
        DatumDataset(root, cache_dir=cache_dir, verbose=False).export()
    assert [n for n in os.listdir(small) if n != "cache.lock"] == []


def test_read_only_cache_location_names_the_path(tmp_path, mounts):
    root = make_class_folders(tmp_path / "src", {"a": 3})
    locked = mounts(tmp_path / "locked", "1m", read_only=True)
    with pytest.raises(OSError, match=re.escape(str(locked))):
        DatumDataset(root, cache_dir=locked / "cache", verbose=False).export()


def test_read_only_source_exports(tmp_path, mounts):
    staging = make_class_folders(tmp_path / "staging", {"a": 4, "b": 4})
    source = mounts(tmp_path / "ro_src", "1m")
    subprocess.run(["cp", "-r", f"{staging}/.", str(source)], check=True)
    subprocess.run(["mount", "-o", "remount,ro", str(source)], check=True)
    ds = DatumDataset(str(source), cache_dir=tmp_path / "cache", verbose=False)
    assert sum(ds.num_examples.values()) == 8


def test_symlink_loop_does_not_trap_the_walk(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 3, "b": 3})
    os.symlink(os.path.join(root, "a"), os.path.join(root, "a", "loop"))
    for follow in (False, True):
        ds = DatumDataset(root, follow_links=follow, validation_split=None,
                          cache_dir=tmp_path / f"cache{follow}", verbose=False)
        assert ds.num_examples == {"train": 6}


def test_huge_declared_size_is_refused_as_a_bomb(tmp_path):
    import struct
    import zlib

    root = make_class_folders(tmp_path / "src", {"a": 3})

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)  # 10 gigapixels.
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    (tmp_path / "src" / "a" / "bomb.png").write_bytes(png)
    ds = DatumDataset(root, validation_split=None, verbose=False)
    with pytest.warns(UserWarning, match="1 invalid files"):
        ds.export()
    assert ds.invalid_files[0]["file"] == "a/bomb.png"
    assert "decompression bomb refused" in ds.invalid_files[0]["reason"]


def test_the_whole_zoo_trains(tmp_path):
    """Every kind of bad or odd file in one folder; training never fails on data."""
    import io

    root = make_class_folders(tmp_path / "src", {"a": 4, "b": 4}, size=(24, 24))
    a, b = tmp_path / "src" / "a", tmp_path / "src" / "b"
    good = io.BytesIO()
    Image.fromarray(np.full((24, 24, 3), 90, np.uint8)).save(good, format="JPEG")
    (a / "truncated.jpg").write_bytes(good.getvalue()[:200])
    (a / "zero.jpg").write_bytes(b"")
    (a / "text.jpg").write_text("not an image")
    Image.new("CMYK", (20, 20), (0, 255, 255, 0)).save(a / "cmyk.jpg")
    Image.new("L", (20, 20), 100).save(b / "gray.png")
    Image.new("RGBA", (20, 20), (1, 2, 3, 4)).save(b / "rgba.png")
    Image.fromarray(np.full((20, 20), 40000, np.uint16)).save(b / "sixteen.png")
    Image.new("P", (20, 20), 3).save(b / "palette.png")
    frames = [Image.new("RGB", (20, 20), c) for c in ((255, 0, 0), (0, 255, 0))]
    frames[0].save(b / "anim.gif", save_all=True, append_images=frames[1:])
    Image.new("RGB", (20, 20), (5, 5, 5)).save(b / "name with spaces ü.webp")
    # A name that is not UTF-8 (Latin-1 'é', from an old zip): Linux allows any bytes.
    with open(os.path.join(os.fsencode(b), b"caf\xe9.png"), "wb") as f:
        Image.new("RGB", (20, 20), (9, 9, 9)).save(f, format="PNG")
    ds = DatumDataset(root, image_size=(24, 24), batch_size=4, verbose=False)
    with pytest.warns(UserWarning, match="3 invalid files"):
        ds.export()
    assert sorted(r["file"] for r in ds.invalid_files) == ["a/text.jpg", "a/truncated.jpg", "a/zero.jpg"]
    model = keras.Sequential([keras.Input((24, 24, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds.train(), validation_data=ds.val(), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert sum(ds.num_examples.values()) == 8 + 8


def test_no_eval_pickle_or_literal_eval_in_the_package():
    package = os.path.join(ROOT, "keras_datum")
    pattern = re.compile(r"\b(pickle|literal_eval|eval\(|exec\()")
    for dirpath, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name)) as f:
                    for number, line in enumerate(f, 1):
                        code = line.split("#")[0]
                        assert not pattern.search(code), f"{name}:{number}: {line.strip()}"
