"""The Apache Beam export writes the cache the local exporter writes."""

import json
import os
import re

import pytest
import tensorflow as tf
from conftest import make_class_folders
from detection_data import draw_items
from detection_data import write_voc
from helpers import shard_stats
from hostile_data import photo
from hostile_data import png_missing_last_row

from keras_datum import DatumDataset
from keras_datum import InvalidImageError
from keras_datum import cli
from keras_datum import export

MULTI_PROCESSING = {"direct_running_mode": "multi_processing", "direct_num_workers": 2}


def _shard_bytes(cache_dir):
    out = {}
    for name in sorted(os.listdir(cache_dir)):
        if name.endswith(".tfrecord"):
            path = os.path.join(cache_dir, name)
            out[name] = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    return out


def _comparable(meta):
    meta = dict(meta)
    del meta["created"]
    return meta


def _assert_same_cache(local, beam):
    assert _shard_bytes(local.cache_dir) == _shard_bytes(beam.cache_dir)
    assert _comparable(local.info) == _comparable(beam.info)
    assert local.invalid_files == beam.invalid_files
    # Only what a local export writes: no Beam leftovers.
    assert sorted(os.listdir(local.cache_dir)) == sorted(os.listdir(beam.cache_dir))


@pytest.mark.slow
def test_multiprocessing_direct_runner_matches_the_local_export(tmp_path, monkeypatch, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 30, "b": 30, "c": 20})
    (tmp_path / "src" / "b" / "broken.png").write_bytes(b"not a png")
    # Pillow reads it, TensorFlow refuses it: the Beam workers check with
    # TensorFlow's decoders too.
    (tmp_path / "src" / "c" / "row.png").write_bytes(png_missing_last_row(photo((80, 80))))
    monkeypatch.setattr(export, "MIN_EXAMPLES_PER_SHARD", 8)  # Several shards per split.
    with pytest.warns(UserWarning, match="2 invalid files"):
        local = DatumDataset(root, cache_dir=tmp_path / "local", verbose=False)
        local.export()
    assert "TensorFlow's decoder refuses it" in str(local.invalid_files)
    capsys.readouterr()
    with pytest.warns(UserWarning, match="2 invalid files"):
        beam = DatumDataset(root, cache_dir=tmp_path / "beam", verbose=True)
        beam.export(runner="DirectRunner", beam_options=MULTI_PROCESSING)
    # The shards were written by Beam's worker processes, not by this one.
    report = re.search(r"wrote (\d+) shards in (\d) worker processes \((.*)\)", capsys.readouterr().out)
    pids = {int(writer.rsplit(":", 1)[1]) for writer in report.group(3).split(", ")}
    assert int(report.group(1)) == len(beam.info["splits"]["train"]["shards"]) + len(
        beam.info["splits"]["val"]["shards"]
    )
    assert pids and os.getpid() not in pids and len(pids) == int(report.group(2)) <= 2
    assert len(beam.info["splits"]["train"]["shards"]) > 2
    assert beam.num_examples == {"train": 65, "val": 15}
    reasons = {entry["file"]: (entry["split"], entry["reason"]) for entry in beam.invalid_files}
    assert sorted(reasons) == ["b/broken.png", "c/row.png"]
    assert reasons["b/broken.png"][0] == "train"
    assert reasons["c/row.png"][1].startswith("TensorFlow's decoder refuses it")
    _assert_same_cache(local, beam)

    # A DatumDataset on the same source and cache reuses the Beam export.
    before = shard_stats(beam)
    again = DatumDataset(root, cache_dir=tmp_path / "beam", verbose=False)
    labels = [int(y) for _, y in again.train(batch_size=None, shuffle=False)]
    assert len(labels) == 65 and sorted(set(labels)) == [0, 1, 2]
    assert shard_stats(again) == before


def test_detection_stats_and_boxes_match_the_local_export(tmp_path):
    root = write_voc(tmp_path / "voc", draw_items(12))
    local = DatumDataset(root, problem="detection", cache_dir=tmp_path / "local", verbose=False)
    local.export()
    beam = DatumDataset(root, problem="detection", cache_dir=tmp_path / "beam", verbose=False)
    beam.export(runner="DirectRunner")
    assert sum(beam.info["splits"]["train"]["objects"]) > 0
    _assert_same_cache(local, beam)


def test_cli_export_with_a_runner_passes_pipeline_flags(tmp_path, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 5, "b": 5})
    cache_dir = str(tmp_path / "cache")
    argv = ["export", root, "--cache-dir", cache_dir, "--runner", "DirectRunner",
            "--direct_num_workers=1"]
    assert cli.main(argv) == 0
    assert "train: 8 examples in 1 shards" in capsys.readouterr().out
    with open(os.path.join(cache_dir, "metadata.json")) as f:
        assert json.load(f)["splits"]["val"]["num_examples"] == 2
    # Without --runner an unknown flag is an error, not silently ignored.
    assert cli.main(["export", root, "--cache-dir", cache_dir, "--direct_num_workers=1"]) == 2
    assert "Beam options need --runner" in capsys.readouterr().err


def test_invalid_example_with_raise_fails_the_pipeline_and_leaves_no_cache(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 4, "b": 4})
    (tmp_path / "src" / "a" / "empty.png").write_bytes(b"")
    ds = DatumDataset(root, cache_dir=tmp_path / "cache", on_invalid="raise", verbose=False)
    # In-process, Beam re-raises the worker's own exception.
    with pytest.raises(InvalidImageError, match=r"empty.png.*empty file"):
        ds.export(runner="DirectRunner")
    assert sorted(os.listdir(tmp_path)) == ["cache.lock", "src"]


def test_bad_runner_arguments_fail_before_any_work(tmp_path, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 3})
    ds = DatumDataset(root, cache_dir=tmp_path / "cache", verbose=False)
    with pytest.raises(ValueError, match="Unknown Beam runner 'NoSuchRunner'"):
        ds.export(runner="NoSuchRunner")
    with pytest.raises(ValueError, match="`beam_options` must be"):
        ds.export(runner="DirectRunner", beam_options=42)
    with pytest.raises(ValueError, match="`beam_options` needs a `runner`"):
        ds.export(beam_options={"direct_num_workers": 2})
    # Beam itself would exit the process on a bad value, or drop a mistyped
    # option with a log line, once the pipeline runs.
    for bad in (["--direct_num_workers=abc"], {"direct_num_workers": "abc"}):
        with pytest.raises(ValueError, match=r"a value Beam cannot parse \(argument --direct_num_workers: invalid int value: 'abc'\)"):
            ds.export(runner="DirectRunner", beam_options=bad)
    from apache_beam.options.pipeline_options import PipelineOptions

    for typo in (["--direct_num_workerz=2"], {"direct_num_workerz": 2}, PipelineOptions(["--direct_num_workerz=2"])):
        with pytest.raises(ValueError, match=r"options that no Beam runner knows: \['direct_num_workerz'\]"):
            ds.export(runner="DirectRunner", beam_options=typo)
    assert sorted(os.listdir(tmp_path)) == ["src"]
    # A mistyped keras-datum flag beside --runner is named, not dropped.
    argv = ["export", root, "--cache-dir", str(tmp_path / "cache"), "--runner", "DirectRunner",
            "--validaton-split=0.5"]
    assert cli.main(argv) == 2
    assert "no Beam runner knows: ['validaton_split']" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["src"]
