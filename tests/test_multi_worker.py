"""MultiWorkerMirroredStrategy: two worker processes on loopback read distinct shards."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

NUM_EXAMPLES = 26
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _regression_csv(root):
    """A Datum CSV folder whose float label is each image's id plus 0.5."""
    rng = np.random.default_rng(0)
    os.makedirs(root / "train")
    lines = ["filename,label"]
    for i in range(NUM_EXAMPLES):
        pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "train" / f"{i:03d}.png")
        lines.append(f"{i:03d}.png,{i + 0.5}")
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    return str(root)


@pytest.mark.slow
def test_two_workers_read_distinct_shards_and_train(tmp_path):
    source = _regression_csv(tmp_path / "src")
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    script = os.path.join(os.path.dirname(__file__), "multi_worker_script.py")
    processes, outputs = [], []
    for index in range(2):
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
        outputs.append(tmp_path / f"worker{index}.json")
        log = open(tmp_path / f"worker{index}.log", "w")
        processes.append(
            subprocess.Popen(
                [sys.executable, script, source, str(tmp_path / "cache"), str(outputs[-1])],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        )
    try:
        for index, process in enumerate(processes):
            code = process.wait(timeout=300)
            log = (tmp_path / f"worker{index}.log").read_text()[-3000:]
            assert code == 0, f"worker {index} failed:\n{log}"
    finally:
        for process in processes:
            process.kill()
    results = [json.loads(path.read_text()) for path in outputs]
    for result in results:
        assert result["is_distributed"]
        assert result["num_replicas"] == 2
        assert result["global_batch_size"] == 8
        assert result["train_shards"] >= 2  # The export made a shard per worker.
        assert result["steps"] >= 2
        assert np.isfinite(result["loss"])
        assert "`data_service` cannot be combined with a multi-worker `strategy`" in result["data_service_refused"]
    first, second = (set(r["seen"]) for r in results)
    assert first and second
    assert not first & second  # Distinct shards: no example on both workers.
    assert first | second == {i + 0.5 for i in range(NUM_EXAMPLES)}
    assert len(results[0]["seen"]) + len(results[1]["seen"]) == NUM_EXAMPLES


def test_shard_minimum_is_checked_against_the_shards_the_cache_has():
    from keras_datum.metadata import Metadata
    from keras_datum.store import options_satisfied

    base = {"validation_split": 0.2, "seed": 1, "max_image_side": None}
    # The option itself never forces a re-export ...
    assert options_satisfied({**base, "min_shards": 1}, {**base, "min_shards": 4})
    assert options_satisfied(base, {**base, "min_shards": 2})

    # ... the shards do: one with examples per worker, in every split.
    def meta(train_shards):
        shards = [{"file": f"train-{i:05d}-of-00002.tfrecord", "num_examples": n}
                  for i, n in enumerate(train_shards)]
        return Metadata.from_json({
            "problem": "classification", "layout": "class_folders", "class_names": [],
            "label_spec": {}, "features": {}, "export_options": {},
            "source_fingerprint": {}, "invalid_files": {"count": 0},
            "splits": {
                "train": {"num_examples": sum(train_shards), "shards": shards},
                "val": {"num_examples": 1, "shards": [
                    {"file": "val-00000-of-00001.tfrecord", "num_examples": 1}]},
            },
        })

    assert meta([15, 15]).has_shards_for(2)
    assert not meta([15, 15]).has_shards_for(3)
    assert not meta([30, 0]).has_shards_for(2)


def test_num_shards_gives_each_worker_a_file_when_there_are_enough_examples():
    from keras_datum import export

    assert export.num_shards(26, 10_000) == 1
    assert export.num_shards(26, 10_000, min_shards=2) == 2
    assert export.num_shards(3, 10_000, min_shards=8) == 3
    # A multiple of the workers, so each reads as many files.
    assert export.num_shards(300, 10_000, min_shards=3) == 6
    assert export.num_shards(1000, 10_000, min_shards=8) == 16


def test_shard_subsets_partition_a_split_even_with_fewer_files_than_workers(tmp_path):
    from conftest import make_class_folders

    from keras_datum import DatumDataset
    from keras_datum import pipeline
    from keras_datum.metadata import Metadata

    root = make_class_folders(tmp_path / "src", {"a": 5, "b": 4})
    ds = DatumDataset(root, image_size=(16, 16), validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    meta = Metadata.from_json(ds.info)
    assert len(meta.splits["train"].shards) == 1
    seen = []
    for index in range(3):  # Three workers, one file: shared by example.
        part = pipeline.build(
            meta, ds.cache_dir, "train", ds.read_options, batch_size=None, shuffle=True,
            repeat=False, seed=None, shuffle_buffer_size=None, shard_subset=(index, 3),
        )
        seen.append(sorted(np.asarray(x).tobytes() for x, _ in part))
    assert all(len(s) == 3 for s in seen)
    everything = [x.tobytes() for x, _ in (
        (np.asarray(x), y) for x, y in ds.train(batch_size=None, shuffle=False))]
    assert sorted(sum(seen, [])) == sorted(everything)
