"""The `keras-datum` command: export, info, verify, preview, benchmark, demo."""

import argparse
import contextlib
import json
import os
import sys

from keras_datum.notices import printable


# Number flags are checked as they are parsed, so a bad value is named by its flag
# (argparse's "argument --image-size: ...") before any work starts.
def _positive_int(text):
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative_int(text):
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive integer, got {text!r}")
    return value


def _int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def _export(args):
    from keras_datum.dataset import DatumDataset

    side = "auto" if args.max_image_side is None else args.max_image_side
    ds = DatumDataset(
        args.source,
        cache_dir=args.cache_dir,
        validation_split=args.validation_split,
        seed=args.seed,
        on_invalid=args.on_invalid,
        follow_links=args.follow_links,
        image_size=(args.image_size, args.image_size),
        max_image_side=None if side == 0 else side,
    )
    if args.beam_args and not args.runner:
        raise ValueError(f"Unknown arguments {args.beam_args} (Beam options need --runner).")
    meta = ds.export(
        force=args.force,
        runner=args.runner,
        beam_options=args.beam_args if args.runner else None,
    )
    print(printable(f"Cache: {ds.cache_dir}"))
    _print_info(meta, ds.cache_dir)


def _print_info(meta, cache_dir):
    from keras_datum import cache
    from keras_datum import storage

    print(printable(f"Source: {meta['source']}"))
    print(f"Problem: {meta['problem']} (layout '{meta['layout']}')")
    names = meta["class_names"]  # Folder names: undecodable bytes are escaped.
    print(printable(f"Classes ({len(names)}): {', '.join(names) if names else '-'}"))
    for split, info in meta["splits"].items():
        print(
            f"  {split}: {info['num_examples']} examples in "
            f"{len(info['shards'])} shards"
        )
    invalid = meta["invalid_files"]["count"]
    print(f"Invalid files left out: {invalid}")
    if invalid:
        with storage.open(os.path.join(cache_dir, cache.REPORT_FILE)) as f:
            for entry in json.load(f):
                print(printable(f"  {entry['split']}/{entry['file']}: {entry['reason']}"))


def _info(args):
    from keras_datum import cache
    from keras_datum import datum_format
    from keras_datum import storage

    path = storage.abspath(args.path)
    if not storage.exists(path):
        raise FileNotFoundError(f"Path not found: {args.path!r}")
    if datum_format.is_export(path):
        print(printable(f"datum export, read in place: {path}"))
        _print_info(datum_format.read_metadata(path), path)
        return
    for cache_dir in _caches(path, args.path):
        print(printable(f"Cache: {cache_dir}"))
        _print_info(cache.read_metadata(cache_dir), cache_dir)


def _caches(path, given):
    """`path` when it is a cache, else the caches its source exported to
    (one per validation carve)."""
    from keras_datum import store

    if store.is_cache_folder(path):
        return [path]
    found = store.caches_of(path)
    if not found:
        raise ValueError(
            f"No keras_datum cache found for {given!r} (looked in "
            f"{store.default_cache_dir(path)!r} and its siblings for other "
            f"carves). Run `keras-datum export {given}` first."
        )
    return found


def _demo(args):
    from keras_datum.demo import run_demo

    accuracy = run_demo(
        data_dir=args.data_dir,
        cache_dir=args.cache_dir,
        images_per_class=args.images_per_class,
        image_size=args.image_size,
        epochs=args.epochs,
    )
    return 0 if accuracy > 0 else 1


def _verify(args):
    from keras_datum import cache
    from keras_datum import datum_format
    from keras_datum import storage
    from keras_datum.verify import verify_cache

    path = storage.abspath(args.path)
    if not storage.exists(path):
        raise FileNotFoundError(f"Path not found: {args.path!r}")
    datum_export = datum_format.is_export(path)
    status = 0
    for cache_dir in [path] if datum_export else _caches(path, args.path):
        problems = verify_cache(cache_dir)
        for problem in problems:
            print(printable(f"DAMAGED: {problem}"))
        if problems:
            # A datum export is read in place: only its writer can rewrite it.
            fix = "write it again with datum" if datum_export else "export again with `keras-datum export --force`"
            print(printable(f"{len(problems)} problems in {cache_dir}; {fix}."))
            status = 1
            continue
        if datum_export:
            splits = datum_format.read_splits(cache_dir)
        else:
            splits = cache.read_metadata(cache_dir)["splits"]
        shards = sum(len(s["shards"]) for s in splits.values())
        examples = sum(s["num_examples"] for s in splits.values())
        print(printable(
            f"OK: {cache_dir}: {shards} shards, {examples} examples, every record intact."
        ))
    return status


def _sized(args):
    """`image_size` when `--image-size` was given, else the dataset's default
    (a text source takes none, and refuses one)."""
    return {} if args.image_size is None else {"image_size": (args.image_size,) * 2}


def _preview(args):
    from keras_datum.dataset import DatumDataset

    ds = DatumDataset(
        args.source,
        follow_links=args.follow_links,
        **_sized(args),
        cache_dir=args.cache_dir,
        validation_split=args.validation_split,
        seed=args.seed,
        verbose=False,
    )
    ds.preview(split=args.split, num_images=args.num_images, path=args.path)
    print(printable(f"Wrote {args.path}"))


def _benchmark(args):
    from keras_datum import throughput
    from keras_datum.dataset import DatumDataset

    side = "auto" if args.max_image_side is None else args.max_image_side
    ds = DatumDataset(
        args.source,
        follow_links=args.follow_links,
        **_sized(args),
        batch_size=args.batch_size,
        cache_dir=args.cache_dir,
        validation_split=args.validation_split,
        seed=args.seed,
        cache=False if args.no_cache else "auto",
        image_dtype=args.image_dtype,
        max_image_side=None if side == 0 else side,
        verbose=not args.json,
    )
    result = throughput.measure(ds, args.split, args.epochs, keras=args.keras)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(throughput.report(result)))


def _carve_flags(parser):
    """The validation carve's flags: a command that reads an export made
    with `export --validation-split 0.1` takes the same, so that it finds
    that carve's cache instead of exporting the default one."""
    parser.add_argument("--validation-split", type=_fraction, default=0.2)
    parser.add_argument("--seed", type=_non_negative_int, default=None)
    parser.add_argument("--follow-links", action="store_true")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-datum",
        description="Validated, cached TFRecord datasets for Keras.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export", help="export a source folder to TFRecords")
    export.add_argument("source")
    export.add_argument("--cache-dir", default=None)
    _carve_flags(export)
    export.add_argument("--on-invalid", choices=["skip", "raise"], default="skip")
    export.add_argument("--force", action="store_true", help="export even if cached")
    export.add_argument(
        "--image-size", type=_positive_int, default=256,
        help="the training image size; the default size cap is twice it",
    )
    export.add_argument(
        "--max-image-side", type=_non_negative_int, default=None,
        help="shrink longer sides to this at export (0 keeps originals)",
    )
    export.add_argument(
        "--runner", default=None,
        help="write the shards with this Apache Beam runner (DirectRunner, "
        "DataflowRunner, FlinkRunner, SparkRunner); other --flags are passed "
        "to the pipeline as its options",
    )
    export.set_defaults(run=_export)

    info = commands.add_parser("info", help="classes, counts, shards, invalid files")
    info.add_argument("path", help="a cache folder, or a source folder")
    info.set_defaults(run=_info)

    preview = commands.add_parser("preview", help="save a grid of captioned samples")
    preview.add_argument("source")
    preview.add_argument("--path", default="preview.png")
    # Checked by preview() before any export: a datum export may name others.
    preview.add_argument("--split", default="train")
    preview.add_argument("--num-images", type=_positive_int, default=16)
    preview.add_argument("--image-size", type=_positive_int, default=None)
    preview.add_argument("--cache-dir", default=None)
    _carve_flags(preview)
    preview.set_defaults(run=_preview)

    verify = commands.add_parser("verify", help="check a cache's CRCs, counts and metadata")
    verify.add_argument("path", help="a cache folder, or a source folder")
    verify.set_defaults(run=_verify)

    benchmark = commands.add_parser(
        "benchmark", help="time reading a split, epoch by epoch, against decoding from memory"
    )
    benchmark.add_argument("source")
    benchmark.add_argument("--cache-dir", default=None)
    _carve_flags(benchmark)
    benchmark.add_argument("--split", default="train", choices=["train", "val", "test"])
    benchmark.add_argument("--image-size", type=_positive_int, default=None)
    benchmark.add_argument("--batch-size", type=_positive_int, default=32)
    benchmark.add_argument("--epochs", type=_positive_int, default=3)
    benchmark.add_argument("--image-dtype", default=None, choices=["uint8"])
    benchmark.add_argument(
        "--max-image-side", type=_non_negative_int, default=None,
        help="the export's size cap, as for export (0 keeps originals)",
    )
    benchmark.add_argument("--no-cache", action="store_true", help="cache=False: every epoch decodes")
    benchmark.add_argument(
        "--keras", action="store_true",
        help="also time one epoch of keras.utils.image_dataset_from_directory (class folders)",
    )
    benchmark.add_argument("--json", action="store_true", help="print the figures as JSON")
    benchmark.set_defaults(run=_benchmark)

    demo = commands.add_parser("demo", help="draw a shapes dataset, export, train")
    demo.add_argument("--data-dir", default=None)
    demo.add_argument("--cache-dir", default=None)
    demo.add_argument("--images-per-class", type=_positive_int, default=500)
    demo.add_argument("--image-size", type=_positive_int, default=64)
    demo.add_argument("--epochs", type=_positive_int, default=20)
    demo.set_defaults(run=_demo)
    return parser


def start_tensorflow_quietly():
    """Imports TensorFlow and finds its devices with the process's stderr
    (file descriptor 2) pointed at /dev/null.

    TensorFlow writes its C++ start-up lines (oneDNN, CUDA probing, cuInit
    on a machine without a GPU) through absl before absl is initialised,
    where `TF_CPP_MIN_LOG_LEVEL` does not reach them; they concern no user of
    the command. A user who sets `TF_CPP_MIN_LOG_LEVEL` sees them as before.
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ or "tensorflow" in sys.modules:
        return
    # The C++ INFO and WARNING lines after the start-up, too.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        import tensorflow as tf

        tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv=None):
    start_tensorflow_quietly()
    parser = build_parser()
    # Flags the CLI does not know are Beam pipeline options, for export only.
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "export":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.beam_args = unknown
    with _escaping_output():
        try:
            return args.run(args) or 0
        except (ValueError, OSError) as e:  # OSError: FileNotFoundError, TimeoutError too.
            print(printable(f"keras-datum {args.command}: error: {e}"), file=sys.stderr)
            return 2


@contextlib.contextmanager
def _escaping_output():
    """stdout and stderr write what their encoding cannot as `\\xe9` escapes.

    The names printed here are escaped (`printable`), but the export's own
    lines and warnings name files too, and a strict terminal (say
    `PYTHONIOENCODING=utf-8:strict`, or an ASCII one) would otherwise end
    the command with a UnicodeEncodeError after the cache was written.
    """
    streams = [s for s in (sys.stdout, sys.stderr) if hasattr(s, "reconfigure")]
    before = [s.errors for s in streams]
    for stream in streams:
        stream.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        for stream, errors in zip(streams, before):
            stream.reconfigure(errors=errors)


if __name__ == "__main__":
    sys.exit(main())
