"""Random access into the export: the wait for each epoch's first batch, a
restart's wait, and how well the index shuffle mixes, against the shuffle
buffer that shuffled train() splits used before.

Run from the repository root:

    python benchmarks/resume.py --output benchmarks/results/resume.md   # minutes
    python benchmarks/resume.py --smoke    # seconds; CI runs it

Figures are medians over `--rounds`. The datasets are `run.py`'s.
- first batch: from `iter()` of a built `ds.train()` to its first batch, in
  the first epoch (nothing decoded yet) and the second (the decoded cache
  on), on 2,000 photo-like JPEGs read at 224 px.
- restart: a fresh process builds the dataset on its cache, puts the stream
  at the middle of epoch 3 (as `callbacks.BackupAndRestore` does) and takes
  one batch: the wait includes indexing the shards (not counted: imports).
- shuffle: over one epoch of the 20,000-file split (5 classes, stored in
  the export's shuffled order), the rank correlation between the stored
  position and the position read (0 is best), the share of a batch's
  examples that were within one batch of each other in stored order (the
  reader's locality; 1/n-ish is best), and the share of the commonest class
  in each of the first 20 batches (0.2 plus sampling noise is best).
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the datasets)

FIRST_BATCH_TARGET_S = 0.3
RESTART_TARGET_S = 2.0
RESTART = r"""
import json, sys, time
import tensorflow as tf
from keras_datum import DatumDataset, positions
path, cache_dir, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
ds = DatumDataset(path, image_size=(size, size), batch_size=32, cache_dir=cache_dir, seed=1,
                  verbose=False, mixed_precision="float32")
train = ds.train()
n = train.stream_state.spec.num_examples
train.stream_state.restore(positions.Position(3, (n // 64) * 32), 1)
next(iter(train))
print(json.dumps({"restart_s": time.perf_counter() - start}))
"""


def _dataset(path, size, cache_dir):
    from keras_datum import DatumDataset

    return DatumDataset(path, image_size=(size, size), batch_size=32, cache_dir=cache_dir,
                        seed=1, verbose=False, mixed_precision="float32")


def first_batches(path, size, cache_dir):
    """Seconds to the first batch of epochs 1 and 2 of one `ds.train()`."""
    train = _dataset(path, size, cache_dir).train()
    waits = []
    for _ in range(2):
        start = time.perf_counter()
        iterator = iter(train)
        next(iterator)
        waits.append(time.perf_counter() - start)
        for _ in iterator:
            pass
        # Gone before the next epoch's is timed: tearing a decoding
        # pipeline's iterator down takes tf.data up to a second now and
        # then, before this change as after it (a `for` loop drops it as
        # it ends, as Keras drops each epoch's).
        del iterator
    return waits


def restart_seconds(path, size, cache_dir):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": run.ROOT}
    result = subprocess.run([sys.executable, "-c", RESTART, path, cache_dir, str(size)],
                            capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["restart_s"]


def _keys(dataset):
    """Each example's pixel hash and label, in the order read."""
    keys, labels = [], []
    for x, y in dataset:
        for image, label in zip(np.asarray(x), np.asarray(y)):
            keys.append(hashlib.sha1(image.tobytes()).hexdigest())
            labels.append(int(label))
    return keys, labels


def _buffered(ds):
    """A shuffled train() as it was read before streams: shuffled shard
    files through a shuffle buffer (the path multi-worker reads still take:
    one worker of one)."""
    from keras_datum import pipeline

    meta = ds._metadata()
    return pipeline.build(
        meta, ds.cache_dir, "train", ds.read_options, batch_size=32, shuffle=True,
        repeat=False, seed=1, shuffle_buffer_size=None, shard_subset=(0, 1),
    )


def shuffle_quality(path, size, cache_dir):
    """The figures of one epoch of the stream and of the buffered shuffle."""
    ds = _dataset(path, size, cache_dir)
    stored, _ = _keys(ds.train(shuffle=False))
    position = {key: i for i, key in enumerate(stored)}
    figures = {}
    for name, dataset in (("stream", ds.train()), ("buffer", _buffered(ds))):
        keys, labels = _keys(dataset)
        places = np.array([position[k] for k in keys])
        ranks = np.arange(len(places))
        near = [
            np.mean(np.abs(np.diff(np.sort(places[i : i + 32]))) <= 32)
            for i in range(0, len(places) - 32, 32)
        ]
        first = [
            max(np.bincount(labels[i : i + 32])) / len(labels[i : i + 32])
            for i in range(0, min(len(labels), 20 * 32), 32)
        ]
        figures[name] = {
            "rank_correlation": float(np.corrcoef(places, ranks)[0, 1]),
            "neighbours_in_batch": float(np.mean(near)),
            "commonest_class_share": float(np.mean(first)),
            "examples_once": sorted(keys) == sorted(stored),
        }
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default=None,
                        help="markdown file for the results (run.py's report includes "
                             "benchmarks/results/resume.md)")
    parser.add_argument("--data-dir", default=os.path.join(run.ROOT, "benchmarks", ".data"),
                        help="run.py's datasets, drawn there if missing")
    args = parser.parse_args()
    specs = run.SMOKE if args.smoke else run.FULL
    rounds = 1 if args.smoke else args.rounds
    data_dir = os.path.join(args.data_dir, "smoke" if args.smoke else "full")
    photos = run.make_dataset(os.path.join(data_dir, "imagenet_like"), specs["imagenet_like"])
    tiny = run.make_dataset(os.path.join(data_dir, "tiny_32px"), specs["tiny_32px"])
    with tempfile.TemporaryDirectory() as work:
        photo_cache, tiny_cache = os.path.join(work, "photos"), os.path.join(work, "tiny")
        _dataset(photos, 224, photo_cache).export()
        _dataset(tiny, 32, tiny_cache).export()
        waits = [first_batches(photos, 224, photo_cache) for _ in range(rounds)]
        restarts = [restart_seconds(tiny, 32, tiny_cache) for _ in range(rounds)]
        quality = shuffle_quality(tiny, 32, tiny_cache)
    report = _report(rounds, specs, waits, restarts, quality)
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)
        print(f"Wrote {args.output}")


def _report(rounds, specs, waits, restarts, quality):
    first = statistics.median(w[0] for w in waits)
    later = statistics.median(w[1] for w in waits)
    restart = statistics.median(restarts)
    photos, tiny = specs["imagenet_like"][0], specs["tiny_32px"][0]
    lines = [
        f"Measured by `python benchmarks/resume.py` on {os.cpu_count()} CPU cores: "
        f"medians of {rounds} rounds.",
        "",
        "| figure | measured | target | met |",
        "|---|---|---|---|",
    ]
    for label, value, target in (
        (f"first batch, epoch 1, {photos} JPEGs at 224 px", first, FIRST_BATCH_TARGET_S),
        (f"first batch, epoch 2 (decoded cache), {photos} JPEGs", later, FIRST_BATCH_TARGET_S),
        (f"restart to first batch, {tiny}-file split", restart, RESTART_TARGET_S),
    ):
        lines.append(f"| {label} | {value:.3f} s | < {target} s | {'yes' if value < target else 'NO'} |")
    lines += [
        "",
        f"The shuffle over one epoch of the {tiny}-file split: `stream` is `ds.train()` "
        "(an index shuffle of the whole split), `buffer` the shuffled shard files "
        "through a shuffle buffer of 2,048 examples that it replaced (still read by "
        "several workers and by tf.data service). Rank correlation of stored and read "
        "positions (0 is best); share of a batch's examples within one batch of each "
        "other in stored order; share of the commonest of 5 classes in the first 20 "
        "batches (0.2 plus sampling noise is best).",
        "",
        "| read | rank correlation | neighbours in a batch | commonest class share | each once |",
        "|---|---|---|---|---|",
    ]
    for name, row in quality.items():
        lines.append(
            f"| {name} | {row['rank_correlation']:+.3f} | {row['neighbours_in_batch']:.3f} | "
            f"{row['commonest_class_share']:.3f} | {row['examples_once']} |"
        )
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    main()
