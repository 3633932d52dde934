"""The fused random-resized-crop against the same crop done after a full decode.

Run from the repository root:

    python benchmarks/crop.py --output benchmarks/results/crop.md   # minutes
    python benchmarks/crop.py --smoke    # seconds; CI runs it

Three pipelines make the same kind of batch, a torchvision-style random
resized crop (area in (0.08, 1), aspect ratio in (3/4, 4/3)) of each image at
224 px, from the same JPEGs (`run.py`'s ImageNet-like ones, 500 x 400 px,
exported whole: `max_image_side=None`, the decoded cache off):

- fused: `ds.train(random_resized_crop=True)`, each JPEG decoded within its
  window alone;
- after decode: `ds.train(augment=[keras_cv.layers.RandomCropAndResize(...)])`,
  each image decoded whole and resized, then cropped and resized back;
- Keras: `keras.utils.image_dataset_from_directory(image_size=224)`, then the
  same layer on each batch.

Each round times one epoch of each, in one process, in turn (the order
rotates between rounds); a ratio is taken within a round, and the table shows
the median over rounds, with the range. Images per CPU-second are shown
beside images per second, with the cores the process kept busy: this machine
runs a pass on one core or two, by chance, which moves wall-clock figures by
up to 2x but not CPU figures.
"""

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the datasets)

TARGET = 1.5
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
NAMES = ("fused", "after decode", "Keras")


def _layer(size):
    import keras_cv

    return keras_cv.layers.RandomCropAndResize(
        target_size=(size, size), crop_area_factor=SCALE, aspect_ratio_factor=RATIO
    )


def pipelines(path, size, cache_dir):
    """name -> a function that builds the epoch's dataset."""
    import keras
    import tensorflow as tf

    from keras_datum import DatumDataset

    ds = DatumDataset(path, image_size=(size, size), batch_size=32, cache_dir=cache_dir,
                      cache=False, max_image_side=None, verbose=False,
                      mixed_precision="float32")
    ds.export()
    layer = _layer(size)

    def keras_pipeline():
        batches = keras.utils.image_dataset_from_directory(
            path, image_size=(size, size), batch_size=32, shuffle=True, verbose=False
        )
        return batches.map(lambda x, y: (layer(x), y), num_parallel_calls=tf.data.AUTOTUNE)

    return {
        "fused": lambda: ds.train(random_resized_crop=(SCALE, RATIO)),
        "after decode": lambda: ds.train(augment=[_layer(size)]),
        "Keras": keras_pipeline,
    }


def measure(path, size, rounds):
    """`{name: [epoch figures per round]}` (see `throughput.time_epoch`)."""
    from keras_datum import throughput

    with tempfile.TemporaryDirectory() as work:
        builds = pipelines(path, size, os.path.join(work, "cache"))
        # One epoch of each first: traces, the OS's file cache.
        for build in builds.values():
            throughput.time_epoch(build())
        figures = {name: [] for name in NAMES}
        for round_ in range(rounds):
            order = NAMES[round_ % 3:] + NAMES[: round_ % 3]
            for name in order:
                epoch = throughput.time_epoch(builds[name]())
                epoch["per_cpu_second"] = epoch["images_per_second"] / max(epoch["cores_busy"], 1e-9)
                figures[name].append(epoch)
        return figures


def _median_range(values, digits):
    return (f"{statistics.median(values):,.{digits}f}",
            f"{min(values):,.{digits}f}-{max(values):,.{digits}f}")


def table(figures, files, smoke):
    lines = [
        f"{files} ImageNet-like JPEGs (500 x 400 px) cropped and resized to 224 px; "
        f"medians of {len(figures['fused'])} paired rounds [range], 1 epoch each"
        + (" (smoke: too small to read)" if smoke else "") + ".",
        "",
        "| pipeline | img/s | img per CPU-s | cores busy |",
        "|---|---|---|---|",
    ]
    for name in NAMES:
        rows = figures[name]
        rate = _median_range([r["images_per_second"] for r in rows], 0)
        cpu = _median_range([r["per_cpu_second"] for r in rows], 0)
        busy = _median_range([r["cores_busy"] for r in rows], 2)
        lines.append(f"| {name} | {rate[0]} [{rate[1]}] | {cpu[0]} [{cpu[1]}] | "
                     f"{busy[0]} [{busy[1]}] |")
    lines += ["", "| ratio (fused / other) | wall clock | per CPU-second | target | met |",
              "|---|---|---|---|---|"]
    checks = []
    for other in NAMES[1:]:
        wall = [f["images_per_second"] / o["images_per_second"]
                for f, o in zip(figures["fused"], figures[other])]
        cpu = [f["per_cpu_second"] / o["per_cpu_second"]
               for f, o in zip(figures["fused"], figures[other])]
        met = statistics.median(wall) >= TARGET and statistics.median(cpu) >= TARGET
        checks.append(met)
        lines.append(f"| fused / {other} | {_median_range(wall, 2)[0]}x [{_median_range(wall, 2)[1]}] "
                     f"| {_median_range(cpu, 2)[0]}x [{_median_range(cpu, 2)[1]}] "
                     f"| >= {TARGET}x | {'yes' if met else 'no'} |")
    return "\n".join(lines) + "\n", checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few files: checks the harness")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--data-dir", default=os.path.join(run.ROOT, "benchmarks", ".data"))
    parser.add_argument("--output", help="write the table here (Markdown)")
    args = parser.parse_args()
    specs = run.SMOKE if args.smoke else run.FULL
    rounds = args.rounds or (1 if args.smoke else 5)
    folder = os.path.join(args.data_dir, "smoke" if args.smoke else "full", "imagenet_like")
    path = run.make_dataset(folder, specs["imagenet_like"])
    files, size = specs["imagenet_like"][0], specs["imagenet_like"][4][0]
    text, checks = table(measure(path, size, rounds), files, args.smoke)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    if not args.smoke and not all(checks):
        print("A target was missed.")


if __name__ == "__main__":
    main()
