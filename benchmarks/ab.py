"""Two checkouts of keras_datum side by side: export and epochs, in paired rounds.

Run from the repository root, with another checkout (a `git worktree` of the
commit to compare with) as `--base`:

    git worktree add /tmp/base <commit>
    python benchmarks/ab.py --base /tmp/base            # minutes
    python benchmarks/ab.py --base /tmp/base --smoke    # seconds

Each round runs every figure once for the base and once for this checkout,
back to back, each in a fresh process (the order alternates between rounds);
a ratio (this checkout / base) is taken within one round, and the table shows
the median over rounds with their range. The datasets are `run.py`'s. CPU
seconds (the process and its export workers) are shown beside the wall clock,
since this machine runs a pass on one core or two by chance.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the datasets)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: files (fewer than run.py's, so that a round takes a minute).
SIZES = {"imagenet_like": 2000, "tiny_32px_2k": 2000, "photos_12mp": 60}
SMOKE_SIZES = {"imagenet_like": 40, "tiny_32px_2k": 100, "photos_12mp": 4}
CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from keras_datum import DatumDataset
path, cache_dir, size = sys.argv[1], sys.argv[2], int(sys.argv[3])

def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

def epoch(dataset):
    start, count = time.perf_counter(), 0
    for x, _ in dataset:
        count += int(x.shape[0])
    return time.perf_counter() - start, count

def dataset(**kwargs):
    return DatumDataset(path, image_size=(size, size), batch_size=32, cache_dir=cache_dir,
                        verbose=False, **kwargs)

out = {}
start, before = time.perf_counter(), cpu()
dataset().num_examples
out["export_s"], out["export_cpu_s"] = time.perf_counter() - start, cpu() - before
before = cpu()
out["uncached_epoch_s"], count = epoch(dataset(cache=False).train())
out["uncached_epoch_cpu_s"] = cpu() - before
train = dataset().train()
out["first_epoch_s"], _ = epoch(train)
out["later_epoch_s"], _ = epoch(train)
# Four more, back to back, as a training loop reads them (a stream keeps one
# iterator across its cached epochs from the second on).
out["next_4_epochs_s"] = sum(epoch(train)[0] for _ in range(4))
out["examples"] = count
print(json.dumps(out))
"""


def _figures(checkout, path, work, size):
    cache_dir = os.path.join(work, "cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": checkout, "KERAS_HOME": os.path.join(work, "home")}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, path, cache_dir, str(size)],
        env=env, capture_output=True, text=True, cwd=work,
    )
    if result.returncode:
        raise RuntimeError(f"{checkout}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(base, name, files, rounds, data_dir, work):
    spec = (files, *run.FULL[name][1:])
    path = run.make_dataset(os.path.join(data_dir, f"{name}-{files}"), spec)
    size = spec[4][0]
    ratios = {}
    for round_ in range(rounds):
        sides = [("base", base), ("new", ROOT)]
        figures = {}
        for side, checkout in sides if round_ % 2 == 0 else sides[::-1]:
            figures[side] = _figures(checkout, path, os.path.join(work, side), size)
        for key, value in figures["new"].items():
            if key.endswith("_s"):
                ratios.setdefault(key, []).append(value / figures["base"][key])
    return {key: (statistics.median(v), min(v), max(v)) for key, v in ratios.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other checkout's root")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny datasets, 2 rounds")
    parser.add_argument("--datasets", nargs="*", default=None, help=f"of {sorted(SIZES)}")
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "keras_datum_ab"))
    args = parser.parse_args()
    sizes = SMOKE_SIZES if args.smoke else SIZES
    if args.datasets:
        sizes = {name: sizes[name] for name in args.datasets}
    rounds = 2 if args.smoke else args.rounds
    print("Time (and CPU time) of this checkout / the base's, median of "
          f"{rounds} paired rounds [range]; below 1 is faster.\n")
    print("| dataset | figure | new / base | range |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for name, files in sizes.items():
            for key, (median, low, high) in compare(
                args.base, name, files, rounds, args.data_dir, work
            ).items():
                print(f"| {name} ({files}) | {key} | {median:.2f} | {low:.2f}-{high:.2f} |")


if __name__ == "__main__":
    main()
