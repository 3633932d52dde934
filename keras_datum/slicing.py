"""Split slicing, spelled as TFDS spells it: `"train[:10%]+val"`.

A spec is one or more parts joined by `+`; each part is a split's name,
with an optional `[from:to]` slice whose bounds are example counts or
percents (`%`), either negative (counted from the end) or left out. A
percent bound becomes `round(percent * n / 100)` examples, TFDS's default
("closest") rounding, so `train[:50%]` and `train[50%:]` share no example
and together hold the whole split.

A slice follows the split's stored order, the order `ds.train(shuffle=False)`
reads, which the export already shuffled: a prefix is a random sample of
the split. Slices name ranges of records (`record_index.Segment`s), so they
need no export of their own. Parts that overlap are refused: every example
of a slice is read once per epoch.
"""

import dataclasses
import re

from keras_datum import record_index
from keras_datum import shard_reader

_BOUND = r"-?\d+(?:\.\d+)?%?"
_PART = re.compile(
    rf"^\s*(?P<split>[\w-]+)\s*(?:\[\s*(?P<start>{_BOUND})?\s*:\s*(?P<stop>{_BOUND})?\s*\])?\s*$"
)


@dataclasses.dataclass(frozen=True)
class Part:
    """Examples `[start, stop)` of `split`, in stored order."""

    split: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Slices:
    """What a spec such as `"train[:10%]+val"` reads: its parts, in order.

    Attributes:
        spec: the spec, as given.
        parts: the `Part`s, in the spec's order.
    """

    spec: str
    parts: tuple[Part, ...]

    @property
    def num_examples(self):
        return sum(part.stop - part.start for part in self.parts)

    @property
    def splits(self):
        """The splits the parts read, each once, in order."""
        return tuple(dict.fromkeys(part.split for part in self.parts))

    def segments(self, meta, cache_dir):
        """The `record_index.Segment`s of the parts: each part's range of
        its split's records, cut at the shard files."""
        segments = []
        for part in self.parts:
            paths, counts = shard_reader.shards(meta, cache_dir, part.split)
            first = 0
            for path, count in zip(paths, counts):
                start, stop = max(part.start - first, 0), min(part.stop - first, count)
                if start < stop:
                    segments.append(record_index.Segment(path, count, start, stop))
                first += count
        return segments

    def file_paths(self, paths_of):
        """The source file of each example, in the slice's order, given
        `paths_of(split)`: the whole split's, in stored order."""
        paths = []
        for part in self.parts:
            paths.extend(paths_of(part.split)[part.start:part.stop])
        return paths


def parse(spec, sizes):
    """The `Slices` that `spec` names, for splits of `sizes` (`{name:
    examples}`).

    Raises:
        ValueError: the spec does not parse, names no split of the export,
            has a bound beyond its split or an empty part, or parts that
            overlap; the message names the spec.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"A split spec must be a string such as 'train[:10%]+val', got {spec!r}."
        )
    parts = tuple(_part(text, spec, sizes) for text in spec.split("+"))
    _check_disjoint(parts, spec)
    return Slices(spec, parts)


def _part(text, spec, sizes):
    match = _PART.match(text)
    if match is None:
        raise ValueError(
            f"Split spec {spec!r}: cannot read {text.strip()!r}. Write each part as "
            "'name', 'name[from:to]' or 'name[from%:to%]' (bounds may be negative or "
            "left out), joined by '+'."
        )
    split = match["split"]
    if split not in sizes:
        raise ValueError(
            f"Split spec {spec!r}: this dataset has no {split!r} split. Its splits are "
            f"{sorted(sizes)}."
        )
    n = sizes[split]
    start = _bound(match["start"], n, 0, spec)
    stop = _bound(match["stop"], n, n, spec)
    if start >= stop:
        raise ValueError(
            f"Split spec {spec!r}: {text.strip()!r} holds no example ({split!r} has {n}; "
            f"the slice is [{start}:{stop}])."
        )
    return Part(split, start, stop)


def _bound(text, n, default, spec):
    """A bound as an example index in [0, n]."""
    if text is None:
        return default
    if text.endswith("%"):
        percent = float(text[:-1])
        if abs(percent) > 100:
            raise ValueError(f"Split spec {spec!r}: {text} is beyond 100%.")
        # TFDS's "closest" rounding (Python's round: halves to even).
        value = round(percent * n / 100.0)
    else:
        if "." in text:
            raise ValueError(f"Split spec {spec!r}: {text} is not a whole number of examples.")
        value = int(text)
        if abs(value) > n:
            raise ValueError(f"Split spec {spec!r}: {text} is beyond the split's {n} examples.")
    return n + value if value < 0 else value


def _check_disjoint(parts, spec):
    for i, part in enumerate(parts):
        for other in parts[:i]:
            if part.split == other.split and part.start < other.stop and other.start < part.stop:
                raise ValueError(
                    f"Split spec {spec!r}: its parts overlap on {part.split!r} (examples "
                    f"[{max(part.start, other.start)}:{min(part.stop, other.stop)}]), so "
                    "they would be read twice an epoch. Give each example once."
                )
