"""Writing the shards with Apache Beam, so the export runs on Dataflow, Flink or Spark.

The driver (the process that calls `export`) plans the export exactly as the
local exporter does: the layout, the validation carve and which records go,
in which order, to which shard. The pipeline then writes the shards, one
shard per element, each on whichever worker gets it: the worker reads and
validates its images with the same `shard_writer.encode_example` and writes the
shard and a small JSON tally beside it. Back on the driver, the tallies
become the metadata, and the export commits as a local one does. So a Beam
export and a local export of the same folder hold the same bytes.

Writing a shard is idempotent (a fixed file name, rewritten whole), so a
runner that retries a failed bundle is safe. The workers must see the source
files and the temporary cache folder under the same paths: on a cluster,
use `gs://` (or another shared file system) for both.

Needs the `beam` extra: `pip install "keras-datum[beam]"`.
"""

import contextlib
import dataclasses
import functools
import io
import json
import os
import socket

from keras_datum import shard_writer
from keras_datum import sources
from keras_datum import storage

# Beside the shards while the pipeline runs: each shard's plan (its records,
# in order) going to the workers, and its tally coming back. The plans travel
# as files, not in the pipeline graph: a runner such as Dataflow limits the
# size of a submitted job, and a million records would exceed it.
TALLY_FOLDER = "beam-tallies"
PLAN_FOLDER = "beam-plans"


def _import_beam():
    try:
        import apache_beam
    except ImportError as e:
        raise ImportError(
            "A Beam export needs Apache Beam: `pip install \"keras-datum[beam]\"`."
        ) from e
    return apache_beam


def pipeline_options(runner, beam_options=None):
    """The `PipelineOptions` for `runner`, checked before any work starts.

    Args:
        runner: a Beam runner name (`"DirectRunner"`, `"DataflowRunner"`,
            `"FlinkRunner"`, `"SparkRunner"`, ...).
        beam_options: `None`, a `PipelineOptions`, a dict of options
            (`{"direct_num_workers": 2}`) or a list of command-line flags
            (`["--project=my-project", "--region=europe-west1"]`).

    Raises:
        ImportError: Apache Beam is not installed.
        ValueError: the runner is unknown or `beam_options` is malformed.
    """
    beam = _import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.options.pipeline_options import StandardOptions

    if not isinstance(runner, str) or not runner:
        raise ValueError(
            f"`runner` must be a Beam runner name such as 'DirectRunner'. Received: runner={runner!r}"
        )
    try:
        beam.runners.create_runner(runner)
    except ValueError as e:
        raise ValueError(f"Unknown Beam runner {runner!r}: {e}") from None
    if not (
        beam_options is None
        or isinstance(beam_options, (PipelineOptions, dict))
        or isinstance(beam_options, (list, tuple))
        and all(isinstance(flag, str) for flag in beam_options)
    ):
        raise ValueError(
            "`beam_options` must be a PipelineOptions, a dict or a list of "
            f"command-line flags. Received: beam_options={beam_options!r}"
        )
    # Beam parses the flags only when the pipeline runs, and then exits the
    # process on a bad value (argparse) or drops an unknown flag with a log
    # line: both are checked here, before any work.
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            if beam_options is None:
                options = PipelineOptions([])
            elif isinstance(beam_options, PipelineOptions):
                options = PipelineOptions([], **beam_options.get_all_options(drop_default=True))
            elif isinstance(beam_options, dict):
                # Beam would take a dict's values as they are ("2" for an
                # int); as flags, they get the types and choices declared.
                options = PipelineOptions(_as_flags(beam_options))
            else:
                options = PipelineOptions(list(beam_options))
            given = beam_options if isinstance(beam_options, PipelineOptions) else options
            known = given.get_all_options()
            unknown = set(given.get_all_options(retain_unknown_options=True)) - set(known)
    except SystemExit:
        reason = (usage.getvalue().strip().splitlines() or ["a bad value"])[-1]
        raise ValueError(
            f"`beam_options` has a value Beam cannot parse ({reason.split('error: ')[-1]}). "
            f"Received: beam_options={beam_options!r}"
        ) from None
    if unknown:
        raise ValueError(
            f"`beam_options` has options that no Beam runner knows: {sorted(unknown)}. "
            f"Received: beam_options={beam_options!r}"
        )
    options.view_as(StandardOptions).runner = runner
    return options


def _as_flags(options):
    """A dict of pipeline options as the command-line flags that say the same."""
    flags = []
    for name, value in options.items():
        if isinstance(value, bool):
            flags += [f"--{name}"] if value else []
        elif isinstance(value, (list, tuple)):
            flags += [f"--{name}={item}" for item in value]
        elif value is not None:
            flags.append(f"--{name}={value}")
    return flags


def _write_one_shard(task, problem_name, feature_spec, export_options, folder, on_invalid):
    """The pipeline's work: one shard and its tally, on a worker."""
    split, name = task
    with storage.open(os.path.join(folder, PLAN_FOLDER, name + ".json")) as f:
        records = [sources.ExampleRecord(**fields) for fields in json.load(f)]
    shard = (name, records)
    tally = shard_writer.encode_shard(
        problem_name, feature_spec, export_options, on_invalid, folder, split, shard
    )
    # A Beam worker may run TensorFlow: it checks its own shard, as the
    # exporting process does for the local writers.
    tally = shard_writer.check_shard(
        problem_name, feature_spec, export_options, on_invalid, folder, split, shard, tally
    )
    writer = f"{socket.gethostname()}:{os.getpid()}"
    with storage.open(os.path.join(folder, TALLY_FOLDER, name + ".json"), "w") as f:
        json.dump({"writer": writer, "tally": tally.to_json()}, f)
    return name


def _runner(options):
    """The runner object for `options`.

    Beam's DirectRunner first tries to download its Prism binary from the
    internet; for a batch pipeline like this one it would then run the
    FnApiRunner anyway, so that runner is used directly: no download, and
    `direct_running_mode`/`direct_num_workers` apply as documented.
    """
    from apache_beam.options.pipeline_options import StandardOptions

    name = options.view_as(StandardOptions).runner
    if name.lower() in ("direct", "directrunner"):
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        return fn_runner.FnApiRunner()
    return None  # Beam resolves the name from the options.


def write_shards(
    problem_name, feature_spec, export_options, plans, folder, on_invalid, runner,
    beam_options, verbose=True,
):
    """Writes the planned shards into `folder` with a Beam pipeline.

    Args:
        plans: split -> `[(shard file name, records in write order)]`, from
            `export.plan_split`.

    Returns:
        split -> the shards' `SplitStats`, in shard order (as the local
        exporter returns them).
    """
    beam = _import_beam()
    options = pipeline_options(runner, beam_options)
    storage.makedirs(os.path.join(folder, TALLY_FOLDER))
    storage.makedirs(os.path.join(folder, PLAN_FOLDER))
    tasks = []
    for split, shards in plans.items():
        for name, records in shards:
            with storage.open(os.path.join(folder, PLAN_FOLDER, name + ".json"), "w") as f:
                json.dump([dataclasses.asdict(r) for r in records], f)
            tasks.append((split, name))
    write = functools.partial(
        _write_one_shard,
        problem_name=problem_name,
        feature_spec=feature_spec,
        export_options=export_options,
        folder=folder,
        on_invalid=on_invalid,
    )
    with beam.Pipeline(runner=_runner(options), options=options) as pipeline:
        _ = (
            pipeline
            | "Shards" >> beam.Create(tasks)
            # Spreads the shards over the workers (Create alone may keep them
            # in one bundle on one worker).
            | "Spread" >> beam.Reshuffle()
            | "Write" >> beam.Map(write)
        )
    tallies, writers = {}, set()
    for split, shards in plans.items():
        tallies[split] = []
        for name, _ in shards:
            with storage.open(os.path.join(folder, TALLY_FOLDER, name + ".json")) as f:
                written = json.load(f)
            tallies[split].append(shard_writer.SplitStats.from_json(written["tally"]))
            writers.add(written["writer"])
    if verbose:
        print(
            f"{runner} wrote {len(tasks)} shards in {len(writers)} worker "
            f"processes ({', '.join(sorted(writers))})."
        )
    # Only the shards, the report and the metadata stay in the cache.
    for temporary in (TALLY_FOLDER, PLAN_FOLDER):
        storage.rmtree(os.path.join(folder, temporary))
    return tallies
