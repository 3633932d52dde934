"""Soak: many epochs over one export with augmentation; memory must stay flat.

    python benchmarks/soak.py               # 20 epochs
    python benchmarks/soak.py --epochs 3    # quick

Every epoch must yield exactly the split's example count, and the resident
memory after the last epoch may exceed the memory after the second (once the
in-memory cache and the shuffle buffer are full) by at most `--tolerance`.
Exits non-zero otherwise. Not a CI test: it runs for minutes.
"""

import argparse
import os
import sys
import tempfile


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--images-per-class", type=int, default=400)
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()

    import keras

    from keras_datum import DatumDataset
    from keras_datum.demo import make_shapes_dataset

    work = tempfile.mkdtemp(prefix="keras_datum_soak_")
    source = make_shapes_dataset(os.path.join(work, "shapes"), args.images_per_class, 64)
    ds = DatumDataset(source, image_size=(64, 64), batch_size=32, cache_dir=os.path.join(work, "cache"),
                      verbose=False)
    expected = ds.num_examples["train"]
    augment = [keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.1)]
    train = ds.train(augment=augment)
    rows, failures = [], []
    for epoch in range(1, args.epochs + 1):
        count = sum(int(x.shape[0]) for x, _ in train)
        rows.append((epoch, count, rss_mb()))
        print(f"epoch {epoch:3d}: {count} examples, RSS {rows[-1][2]:.0f} MB", flush=True)
        if count != expected:
            failures.append(f"epoch {epoch} yielded {count} examples, expected {expected}")
    if len(rows) >= 3:
        settled, last = rows[1][2], rows[-1][2]
        growth = (last - settled) / settled
        print(f"RSS after epoch 2: {settled:.0f} MB; after epoch {rows[-1][0]}: {last:.0f} MB ({growth:+.1%})")
        if growth > args.tolerance:
            failures.append(f"RSS grew {growth:.1%} after the cache settled (tolerance {args.tolerance:.0%})")
    for failure in failures:
        print("FAIL:", failure)
    print("soak passed" if not failures else "soak failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
