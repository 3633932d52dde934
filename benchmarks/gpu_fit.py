"""ResNet50 `model.fit` fed by `ds.train()` against the same model on synthetic data.

The issue's accelerator check: on a machine with a GPU, mixed precision,
steps per second of `model.fit` fed by `DatumDataset.train()` over
ImageNet-like JPEGs, against the same compiled model fed by one in-memory
batch repeated (the same shapes, dtypes and steps per epoch, through the same
Keras data path). Run from the repository root:

    python benchmarks/gpu_fit.py --output benchmarks/results/gpu_fit.md
    python benchmarks/gpu_fit.py --image-dtype uint8 --output benchmarks/results/gpu_fit.md
    python benchmarks/gpu_fit.py --files 40000 --epochs 1 --no-cache --output benchmarks/results/gpu_fit.md
    python benchmarks/gpu_fit.py --smoke         # CPU, about a minute: CI keeps it alive

`--output` appends the command and its table to a markdown file, which
`benchmarks/run.py` copies into `docs/performance.md`.

Keras may run on the TensorFlow or JAX backend (`KERAS_BACKEND`): the
pipeline is tf.data either way, and Keras's JAX trainer reads tf.data datasets.

What it measures, in this order, on one model compiled once:
1. a warm-up epoch on synthetic data (compiles the train step for the full
   batch and the last, partial one);
2. the first epoch of `ds.train()` (decoding JPEGs and filling the decoded
   cache), then `--rounds` rounds, each `--epochs` epochs of synthetic data
   and `--epochs` epochs of the same `ds.train()` dataset (reading the cache,
   or decoding again with `--no-cache`);
3. the in-memory decode limit of the machine's cores with no model running
   (at most `LIMIT_FILES` of the JPEGs, decoded and resized three times).

An epoch's time runs from Keras's `on_epoch_begin` to `on_epoch_end`, which
waits for the step's results, so that asynchronous device work is counted.
A ratio is the median over rounds of the ratio of the median epoch times
within a round. Each epoch is also split at the start of its second step,
which tells the wait for the first batch (a shuffle buffer's fill) from the
rate the pipeline keeps up after it. The markdown table printed last goes into
`docs/performance.md` as printed.
"""

import argparse
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the harness's ImageNet-like images)

TARGET = 0.95
# Files decoded for the in-memory decode limit (a rate; see `main`).
LIMIT_FILES = 8000


def _draw(args):
    path, spec, first, count = args
    run.draw_files(path, spec, first, count, seed=first)


def draw_dataset(path, files, processes):
    """`files` ImageNet-like JPEGs (the harness's kind), drawn in parallel."""
    marker = os.path.join(path, ".complete")
    if os.path.exists(marker):
        return path
    shutil.rmtree(path, ignore_errors=True)
    spec = run.FULL["imagenet_like"]
    step = -(-files // processes)
    jobs = [(path, spec, first, min(step, files - first)) for first in range(0, files, step)]
    with multiprocessing.Pool(processes) as pool:
        pool.map(_draw, jobs)
    open(marker, "w").close()
    return path


def epoch_timer():
    """A Keras callback whose `times` are the epochs' wall times, and whose
    `startups` are the times from each epoch's start to the start of its
    second step: the wait for the first batch, plus the first step's
    dispatch (asynchronous on an accelerator)."""
    import keras  # Not at the top: --draw-only runs without Keras.

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []
            self.startups = []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            # Only a batch hook at the start of a step: Keras still runs
            # its end-of-step callbacks asynchronously.
            if batch == 1:
                self.startups.append(time.perf_counter() - self._start)

        def on_epoch_end(self, epoch, logs=None):
            # Keras turns the epoch's logs into Python numbers before this
            # call, which waits for the last step on the device.
            self.times.append(time.perf_counter() - self._start)

    return EpochTimes()


def synthetic_like(dataset, num_examples, batch_size):
    """One batch of `dataset`, repeated as a dataset with the same batch shapes
    (full batches, then the partial last one) and the same steps per epoch."""
    import tensorflow as tf

    x, y = next(iter(dataset))
    full, rest = divmod(num_examples, batch_size)
    synthetic = tf.data.Dataset.from_tensors((x, y)).repeat(full)
    if rest:
        synthetic = synthetic.concatenate(tf.data.Dataset.from_tensors((x[:rest], y[:rest])))
    return synthetic.prefetch(2)


def check_same_feed(train, synthetic):
    """Raises unless both datasets give the same steps per epoch, dtypes and
    per-example shapes: the comparison is only fair if they do."""
    import tensorflow as tf

    def described(dataset):
        specs = [(s.dtype.name, tuple(s.shape[1:])) for s in tf.nest.flatten(dataset.element_spec)]
        return int(dataset.cardinality()), specs

    if described(train) != described(synthetic):
        raise RuntimeError(
            f"The synthetic feed differs from ds.train(): {described(synthetic)} "
            f"against {described(train)}"
        )


def build_model(image_size, num_classes):
    import keras

    return keras.Sequential([
        keras.Input((*image_size, 3)),
        keras.layers.Rescaling(1 / 127.5, offset=-1),
        keras.applications.ResNet50(
            weights=None, input_shape=(*image_size, 3), classes=num_classes
        ),
    ])


def fit_epochs(model, dataset, epochs):
    """Epoch times, and times to each epoch's second step (see `epoch_timer`)."""
    times = epoch_timer()
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[times])
    return times.times, times.startups


def describe_device():
    """The backend, and the device it trains on (JAX's first device, or
    TensorFlow's first GPU); other backends are named only."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return backend, f"{device.platform}: {device.device_kind}"
    if backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        return backend, f"gpu: {gpus[0].name}" if gpus else "cpu"
    return backend, "device not queried"


def _after_first_step(result, key):
    """Steps per second from an epoch's second step on, or None."""
    startup = result[f"{key}_startup"]
    if startup is None:
        return None
    return (result["steps"] - 1) / (result[f"{key}_epoch"] - startup)


def markdown(result):
    def cells(key):
        """The epoch's, and its steps after the first (see `epoch_timer`)."""
        steady = _after_first_step(result, key)
        startup = result[f"{key}_startup"]
        return (
            f"{result[f'{key}_steps']:.2f} | {result[f'{key}_epoch']:.3f} | "
            + ("| " if steady is None else f"{startup:.3f} | {steady:.2f} ")
        )

    lines = [
        "| figure | steps/s | epoch (s) | to 2nd step (s) | steps/s from 2nd step "
        "| vs synthetic | target | met |",
        "|---|---|---|---|---|---|---|---|",
        f"| synthetic in-memory batch | {cells('synthetic')}| 1.00x | | |",
    ]
    limit_ratio = result["limit_steps"] / result["synthetic_steps"]
    lines.append(
        f"| in-memory decode limit ({result['cpus']} cores, no model), batches of {result['batch_size']} "
        f"| {result['limit_steps']:.2f} | | | | {limit_ratio:.2f}x | | |"
    )
    for key, label in (("first", "`ds.train()`, first epoch" + ("" if result["no_cache"] else " (decode, fill cache)")),
                       ("later", "`ds.train()`, later epochs" + (" (decoding again)" if result["no_cache"] else " (decoded cache)"))):
        ratio = result[f"{key}_ratio"]
        lines.append(
            f"| {label} | {cells(key)}"
            f"| {ratio:.2f}x | {TARGET:.2f}x | {'yes' if ratio >= TARGET else '**no**'} |"
        )
    rounds = ", ".join(f"{r:.2f}x" for r in result["round_ratios"])
    steady = _after_first_step(result, "first")
    lines += [
        "",
        f"Later-epoch ratio in each round: {rounds}. The first epoch ran at "
        f"{result['first_steps'] / result['limit_steps']:.2f}x the decode limit"
        + (
            "." if steady is None else
            f"; from its second step on, it ran at {steady / _after_first_step(result, 'synthetic'):.2f}x "
            "the synthetic batch over the same steps."
        ),
        "",
        f"Setup: Keras {result['keras']} on the {result['backend']} backend ({result['device']}), "
        f"TensorFlow {result['tensorflow']} (tf.data), {result['cpus']} CPU cores, "
        f"policy {result['policy']}, batch {result['batch_size']} of "
        f"{result['image_size'][0]}x{result['image_size'][1]} {result['x_dtype']} images, "
        f"{result['num_examples']} training examples ({result['steps']} steps per epoch"
        f"{', cache off' if result['no_cache'] else ''}"
        f"{'' if result['shuffle_buffer'] is None else ', shuffle buffer ' + str(result['shuffle_buffer'])}"
        f"{'' if result['max_image_side'] is None else ', images capped at ' + str(result['max_image_side']) + ' pixels at export'}"
        f"{'' if result['threads'] is None else ', tf.data threads ' + str(result['threads'])}), "
        f"{result['rounds']} rounds of {result['epochs']} epochs each; export of "
        f"{result['files']} JPEGs took {result['export_s']:.1f} s.",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds on a CPU")
    parser.add_argument("--files", type=int, default=None, help="JPEGs to draw (default 5000)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 128")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per round (default 5)")
    parser.add_argument("--rounds", type=int, default=None, help="default 3")
    parser.add_argument(
        "--mixed-precision", default=None,
        help="the DatumDataset's mixed_precision (default mixed_float16; float32 with --smoke)",
    )
    parser.add_argument("--image-dtype", default=None, choices=(None, "uint8"))
    parser.add_argument("--data-dir", default=None, help="where to draw the JPEGs (default: a temporary folder)")
    parser.add_argument("--draw-only", action="store_true", help="only draw the JPEGs into --data-dir")
    parser.add_argument(
        "--no-cache", action="store_true",
        help="cache=False: every epoch decodes, as with a split over the cache budget",
    )
    parser.add_argument(
        "--shuffle-buffer", type=int, default=None,
        help="the DatumDataset's shuffle_buffer_size (default: its own)",
    )
    parser.add_argument(
        "--max-image-side", type=int, default=None,
        help="the DatumDataset's export-time size cap (default: its own, 2 x 224)",
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="tf.data's private thread pool for ds.train() (default: one thread per core), "
        "to leave cores to the training loop",
    )
    parser.add_argument("--output", default=None, help="markdown file to append the command and table to")
    args = parser.parse_args()
    files = args.files or (30 if args.smoke else 5000)
    batch_size = args.batch_size or (4 if args.smoke else 128)
    epochs = args.epochs or (1 if args.smoke else 5)
    rounds = args.rounds or (1 if args.smoke else 3)
    image_size = (32, 32) if args.smoke else (224, 224)
    mixed_precision = args.mixed_precision or ("float32" if args.smoke else "mixed_float16")

    if args.draw_only:
        if not args.data_dir:
            parser.error("--draw-only needs --data-dir")
        draw_dataset(args.data_dir, files, os.cpu_count() or 1)
        return 0
    work = tempfile.mkdtemp(prefix="keras_datum_gpu_fit_")
    try:
        data_dir = args.data_dir or os.path.join(work, "images")
        start = time.perf_counter()
        draw_dataset(data_dir, files, os.cpu_count() or 1)
        print(f"drew {files} JPEGs in {time.perf_counter() - start:.1f} s", flush=True)

        import keras
        import tensorflow as tf

        from keras_datum import DatumDataset

        start = time.perf_counter()
        ds = DatumDataset(
            data_dir, image_size=image_size, batch_size=batch_size, seed=1,
            cache_dir=os.path.join(work, "cache"), verbose=False,
            mixed_precision=mixed_precision, image_dtype=args.image_dtype,
            cache=False if args.no_cache else "auto",
            shuffle_buffer_size=args.shuffle_buffer,
            max_image_side=args.max_image_side or "auto",
        )
        num_examples = ds.num_examples["train"]
        export_s = time.perf_counter() - start
        print(f"exported in {export_s:.1f} s: {ds.num_examples}", flush=True)

        train = ds.train()
        if args.threads:
            options = tf.data.Options()
            options.threading.private_threadpool_size = args.threads
            train = train.with_options(options)
        synthetic = synthetic_like(ds.train(), num_examples, batch_size)
        check_same_feed(train, synthetic)
        model = build_model(image_size, len(ds.class_names))
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
        )
        start = time.perf_counter()
        fit_epochs(model, synthetic, 1)
        print(f"warm-up epoch (compiles) {time.perf_counter() - start:.1f} s", flush=True)

        (first,), first_startups = fit_epochs(model, train, 1)
        print(f"first ds.train() epoch {first:.3f} s", flush=True)
        synthetic_all, later_all, round_ratios = [], [], []
        startups = {"synthetic": [], "later": []}
        for index in range(rounds):
            synthetic_times, synthetic_startups = fit_epochs(model, synthetic, epochs)
            later_times, later_startups = fit_epochs(model, train, epochs)
            synthetic_all += synthetic_times
            later_all += later_times
            startups["synthetic"] += synthetic_startups
            startups["later"] += later_startups
            round_ratios.append(statistics.median(synthetic_times) / statistics.median(later_times))
            print(f"round {index + 1}: synthetic {synthetic_times}, ds.train() {later_times}",
                  flush=True)

        # The in-memory decode limit on this machine's cores, with no model
        # running: what the first epoch (which decodes every JPEG) can reach.
        # A rate: every file is not needed, and decoding tens of thousands
        # three times would cost minutes of a shared machine's time.
        names = sorted(
            os.path.join(data_dir, cls, name)
            for cls in run.CLASSES
            for name in os.listdir(os.path.join(data_dir, cls))
        )[:LIMIT_FILES]
        encoded = []
        for name in names:
            with open(name, "rb") as f:
                encoded.append(f.read())
        limit_rates = [run.decode_limit_rate(encoded, image_size) for _ in range(3)]
        print(f"decode limit (images/s): {limit_rates}", flush=True)

        steps = -(-num_examples // batch_size)
        synthetic_epoch = statistics.median(synthetic_all)
        later_epoch = statistics.median(later_all)
        backend, device = describe_device()
        result = {
            "synthetic_epoch": synthetic_epoch,
            "synthetic_steps": steps / synthetic_epoch,
            "first_epoch": first,
            # With one step per epoch there is no second step to time.
            "first_startup": first_startups[0] if first_startups else None,
            "synthetic_startup": statistics.median(startups["synthetic"]) if first_startups else None,
            "later_startup": statistics.median(startups["later"]) if first_startups else None,
            "first_steps": steps / first,
            "first_ratio": synthetic_epoch / first,
            "limit_steps": statistics.median(limit_rates) / batch_size,
            "later_epoch": later_epoch,
            "later_steps": steps / later_epoch,
            "later_ratio": statistics.median(round_ratios),
            "round_ratios": round_ratios,
            "keras": keras.__version__,
            "tensorflow": tf.__version__,
            "backend": backend,
            "device": device,
            "cpus": os.cpu_count(),
            "policy": keras.mixed_precision.global_policy().name,
            "batch_size": batch_size,
            "image_size": image_size,
            "x_dtype": train.element_spec[0].dtype.name,
            "num_examples": num_examples,
            "steps": steps,
            "rounds": rounds,
            "epochs": epochs,
            "files": files,
            "no_cache": args.no_cache,
            "shuffle_buffer": args.shuffle_buffer,
            "max_image_side": args.max_image_side,
            "threads": args.threads,
            "export_s": export_s,
        }
        print(f"python {platform.python_version()}", flush=True)
        table = markdown(result)
        print(table)
        if args.output:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            command = " ".join(["python benchmarks/gpu_fit.py", *sys.argv[1:]])
            with open(args.output, "a") as f:
                f.write(f"`{command}`:\n\n{table}\n\n")
            print(f"Appended to {args.output}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
