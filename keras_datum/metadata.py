"""An export's metadata as typed, frozen objects, as TFDS's `SplitInfo`.

`metadata.json` (see `cache.validate_metadata` for its schema) is read into
a `Metadata`, with a `SplitInfo` per split and a `ShardInfo` per shard
file. `to_json` gives back the JSON exactly as it was read: the objects add
types and derived counts, never keys, so a cache written by any version
with this schema reads and compares the same.
"""

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

# The key of a datum export's own description (see `datum_format`): its
# metadata is made when it is read in place, and never written.
DATUM_EXPORT_KEY = "datum_export"


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split.

    Attributes:
        file: the file's name, in the cache folder.
        num_examples: the examples it holds.
    """

    file: str
    num_examples: int

    @classmethod
    def from_json(cls, data):
        return cls(file=data["file"], num_examples=int(data["num_examples"]))

    def to_json(self):
        return {"file": self.file, "num_examples": self.num_examples}


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shards and the statistics the export recorded.

    Attributes:
        name: `"train"`, `"val"`, `"test"` (a datum export may name others).
        num_examples: the examples of the split.
        shards: its `ShardInfo`s, in order.
        stats: the split's whole JSON entry, with the export's statistics
            (`image_sizes`, `raw_images`, `characters`, ...).
    """

    name: str
    num_examples: int
    shards: tuple[ShardInfo, ...]
    stats: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_json(cls, name, data):
        return cls(
            name=name,
            num_examples=int(data["num_examples"]),
            shards=tuple(ShardInfo.from_json(s) for s in data["shards"]),
            stats=data,
        )

    def to_json(self):
        return copy.deepcopy(dict(self.stats))

    @property
    def filled_shards(self):
        """The shards that hold examples (an export may write empty ones)."""
        return tuple(s for s in self.shards if s.num_examples > 0)

    def shard_paths(self, folder):
        """The paths of the shards with examples, in `folder`."""
        return [os.path.join(folder, s.file) for s in self.filled_shards]


@dataclasses.dataclass(frozen=True)
class Metadata:
    """An export's metadata.

    Attributes:
        problem: the problem type's name.
        layout: the source layout's name.
        class_names: the class names, in label order.
        label_spec: the labels' description (`type`, `num_classes`, ...).
        features: the JSON feature spec of a stored example.
        splits: each split's `SplitInfo`, by name.
        export_options: the export options it was made with, as recorded.
        source_fingerprint: the source's fingerprint (its `digest`).
        invalid_count: the files the export left out.
        json: the whole metadata JSON, as read (the problems' hooks and
            `datum_format` read their own keys in it).
    """

    problem: str
    layout: str
    class_names: tuple[str, ...]
    label_spec: Mapping[str, Any]
    features: Mapping[str, Any]
    splits: Mapping[str, SplitInfo]
    export_options: Mapping[str, Any]
    source_fingerprint: Mapping[str, Any]
    invalid_count: int
    json: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data):
        """The `Metadata` of a JSON object already validated (see
        `cache.validate_metadata`) or made by `datum_format.read_metadata`."""
        return cls(
            problem=data["problem"],
            layout=data["layout"],
            class_names=tuple(data["class_names"]),
            label_spec=data["label_spec"],
            features=data["features"],
            splits={name: SplitInfo.from_json(name, s) for name, s in data["splits"].items()},
            export_options=data["export_options"],
            source_fingerprint=data["source_fingerprint"],
            invalid_count=int(data["invalid_files"]["count"]),
            json=data,
        )

    def to_json(self):
        """The JSON object, as read (a copy: changing it changes nothing here)."""
        return copy.deepcopy(dict(self.json))

    @property
    def in_place(self):
        """Whether this describes a datum export read in place."""
        return DATUM_EXPORT_KEY in self.json

    @property
    def num_examples(self):
        """Examples per split, for example `{"train": 2936, "val": 734}`."""
        return {name: split.num_examples for name, split in self.splits.items()}

    def split(self, name):
        """The `SplitInfo` of `name`.

        Raises:
            ValueError: there is no such split; the message lists them.
        """
        if name not in self.splits:
            raise ValueError(
                f"This dataset has no {name!r} split. Its splits are {sorted(self.splits)}."
            )
        return self.splits[name]

    def has_shards_for(self, workers):
        """Whether every split has a shard with examples for each of
        `workers` (or one per example, when it has fewer)."""
        return all(
            len(split.filled_shards) >= min(workers, split.num_examples)
            for split in self.splits.values()
        )
