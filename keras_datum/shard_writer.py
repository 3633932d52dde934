"""Writing one shard: its examples read, validated and serialized, its
records written, its images checked with TensorFlow's decoders, and its tally.

The local export (in threads or forked processes) and Beam workers write
shards with these same functions, so both write the same bytes. A forked
export worker calls only `encode_shard`; `check_shard` needs TensorFlow and
runs in the exporting process or a Beam worker.
"""

import collections
import functools

from keras_datum import cache
from keras_datum import decodable
from keras_datum import errors
from keras_datum import problems
from keras_datum import records as record_files
from keras_datum import storage


def example_encoder(feature_spec):
    """Serializes a problem's features plus the source file name (see
    `records.ExampleEncoder`).

    `feature_spec` gives each feature's type, so that an empty list (an
    image without boxes) is still stored with the right type.
    """
    spec = {**feature_spec, **cache.SOURCE_FEATURES}
    return record_files.ExampleEncoder({name: s["dtype"] for name, s in spec.items()})


def encode_example(problem_name, options, encoder, record, refused=None):
    """Reads, validates and serializes one record (in a thread or a process).

    `refused` maps source files that TensorFlow's decoders refused in an
    earlier write of the shard (see `check_shard`) to the reason.

    Returns:
        `(serialized example, stats)`, or `(InvalidExampleError, None)`.
    """
    if refused and record.relpath in refused:
        return errors.InvalidImageError(refused[record.relpath]), None
    problem = problems.get(problem_name)
    try:
        features, stats = problem.encode(record, options)
    except errors.InvalidExampleError as e:
        return e, None
    features["source/filename"] = record.relpath.encode("utf-8", "surrogateescape")
    return encoder(features), stats


def encode_shard(problem_name, feature_spec, export_options, on_invalid, folder, split, shard,
                 refused=None):
    """Reads, validates and writes one whole shard; returns its `SplitStats`.

    What an export worker process (or a Beam worker) does with a shard of
    the plan: `shard` is `(file name, records in write order)`. Its images
    still need TensorFlow's check (`check_shard`), which a forked worker
    cannot make.
    """
    name, members = shard
    encode_one = functools.partial(
        encode_example, problem_name, export_options, example_encoder(feature_spec),
        refused=refused,
    )
    return write_shard(
        storage.join(folder, name), split, members, map(encode_one, members), on_invalid
    )


# Writes of one shard: the first, and again without what TensorFlow refused
# (a deterministic write refuses nothing more the second time).
_MAX_WRITES = 3


def check_shard(problem_name, feature_spec, export_options, on_invalid, folder, split, shard,
                tally):
    """TensorFlow's check of a written shard's unsettled images (see
    `encode.EncodedImage.settled` and `decodable`): a shard holding images
    that TensorFlow's decoders refuse is written again without them, and
    they are reported as invalid (or, with `on_invalid="raise"`, raise
    naming the file).

    Returns:
        The shard's `SplitStats`: `tally` when every image decodes.
    """
    refused = {}
    path = storage.join(folder, shard[0])
    for _ in range(_MAX_WRITES):
        if not tally.unsettled:
            return tally
        found = decodable.undecodable_records(path, set(tally.unsettled))
        if not found:
            tally.unsettled = []
            return tally
        refused.update(found)
        tally = encode_shard(problem_name, feature_spec, export_options, on_invalid, folder,
                             split, shard, refused)
    raise RuntimeError(f"{path}: TensorFlow refused its images again after {_MAX_WRITES} writes.")


class SplitStats:
    """What one shard (or, merged, one split) of an export holds.

    Counts the examples written per class and the invalid ones left out, and
    adds up the stats that a problem's `encode` returns for each example:
    `height`/`width` give image size statistics; other integers are summed
    (boxes clipped, boxes dropped); lists of ints are counted per value
    (objects per class); sets are merged (mask values seen). Tallies of
    shards written apart (by Beam workers) merge into the split's, and travel
    as JSON.
    """

    def __init__(self):
        self.num_examples = 0
        self.class_counts = collections.Counter()
        self.invalid = []
        # [min, max, sum, count] of each side, so that shards merge.
        self.sizes = {}
        self.sums = collections.Counter()
        self.counts = collections.defaultdict(collections.Counter)
        self.unions = collections.defaultdict(set)
        # Source files whose stored image the export's own checks did not
        # settle: TensorFlow's decoders judge them (`check_shard`).
        self.unsettled = []

    def add(self, stratum, stats):
        self.num_examples += 1
        self.class_counts[stratum] += 1
        for key, value in stats.items():
            if key in ("height", "width"):
                low, high, total, count = self.sizes.get(key, (value, value, 0, 0))
                self.sizes[key] = (min(low, value), max(high, value), total + value, count + 1)
            elif isinstance(value, int):
                self.sums[key] += value
            elif isinstance(value, list):
                self.counts[key].update(value)
            else:
                self.unions[key].update(value)

    def merge(self, other):
        self.num_examples += other.num_examples
        self.class_counts.update(other.class_counts)
        self.invalid += other.invalid
        self.unsettled += other.unsettled
        for key, (low, high, total, count) in other.sizes.items():
            mine = self.sizes.get(key, (low, high, 0, 0))
            self.sizes[key] = (
                min(mine[0], low), max(mine[1], high), mine[2] + total, mine[3] + count
            )
        self.sums.update(other.sums)
        for key, counter in other.counts.items():
            self.counts[key].update(counter)
        for key, values in other.unions.items():
            self.unions[key].update(values)

    def to_json(self):
        return {
            "num_examples": self.num_examples,
            # Strata are class indices or None; JSON keys must be strings.
            "class_counts": [[k, v] for k, v in self.class_counts.items()],
            "invalid": self.invalid,
            "unsettled": self.unsettled,
            "sizes": self.sizes,
            "sums": dict(self.sums),
            "counts": {k: [[v, n] for v, n in c.items()] for k, c in self.counts.items()},
            "unions": {k: sorted(int(v) for v in s) for k, s in self.unions.items()},
        }

    @classmethod
    def from_json(cls, data):
        tally = cls()
        tally.num_examples = data["num_examples"]
        tally.class_counts.update({k: v for k, v in data["class_counts"]})
        tally.invalid = list(data["invalid"])
        tally.unsettled = list(data.get("unsettled", []))
        tally.sizes = {k: tuple(v) for k, v in data["sizes"].items()}
        tally.sums.update(data["sums"])
        for key, pairs in data["counts"].items():
            tally.counts[key].update({v: n for v, n in pairs})
        for key, values in data["unions"].items():
            tally.unions[key].update(values)
        return tally

    def as_dict(self, num_classes):
        out = {"image_sizes": _size_stats(self.sizes)}
        out.update(self.sums)
        for key, counter in self.counts.items():
            size = max(num_classes, max(counter, default=-1) + 1)
            out[key] = [counter[i] for i in range(size)]
        for key, values in self.unions.items():
            out[key] = sorted(int(v) for v in values)
        return out


def write_shard(path, split, records, results, on_invalid, progress=None):
    """Writes one shard; returns its `SplitStats`.

    Args:
        path: the shard file.
        split: the split's name, for the invalid-file report.
        records: the shard's records in write order.
        results: `encode_example`'s results for `records`, in the same
            order (an iterator: only `len(records)` are taken from it).
        on_invalid: `"skip"` reports invalid examples, `"raise"` raises.
        progress: called once per example, when given.
    """
    tally = SplitStats()
    with record_files.RecordWriter(path) as writer:  # Even an empty shard exists.
        for record, (result, stats) in zip(records, results):
            if progress is not None:
                progress()
            if isinstance(result, errors.InvalidExampleError):
                if on_invalid == "raise":
                    raise type(result)(
                        f"Invalid example {record.path!r}: {result}. Pass "
                        "on_invalid='skip' to leave such files out."
                    )
                tally.invalid.append(
                    {"split": split, "file": record.relpath, "reason": str(result)}
                )
                continue
            writer.write(result)
            if stats.pop("unsettled", False):
                tally.unsettled.append(record.relpath)
            tally.add(record.stratum, stats)
    return tally


def _size_stats(sizes):
    return {
        name: {"min": int(low), "mean": float(total / count), "max": int(high)}
        for name, (low, high, total, count) in sorted(sizes.items())
    }
