"""Where a resumable stream is: the arithmetic of epochs, steps and batches.

A resumable stream (`ds.train()` reading with random access, see
`streams`) yields the records of epoch `e` in an order that depends only on
`(seed, e)`, cut into batches of the global batch size. A `Position` is
where the next batch starts: an epoch and an example offset in it. Starting
at any position costs arithmetic, not reading. Plain Python: no TensorFlow.
"""

import dataclasses
import hashlib
import json
import random
import threading
import weakref


@dataclasses.dataclass(frozen=True)
class Position:
    """Where the next batch of a stream starts.

    Attributes:
        epoch: the epoch, from 0.
        offset: the examples of that epoch already handed out: a multiple
            of the global batch size, below the epoch's examples.
    """

    epoch: int = 0
    offset: int = 0

    def to_json(self):
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_json(cls, value):
        return cls(int(value["epoch"]), int(value["offset"]))


def export_identity(metadata_json):
    """A short hash of what an export holds: its splits (shards, counts,
    class counts, image stats), options, features, classes and the size of
    its source (files and bytes). Not when it was made, nor the source's
    modification times: the same files copied to a new machine after a
    preemption export again to the same records, and resume."""
    held = {
        key: metadata_json.get(key)
        for key in ("splits", "export_options", "features", "class_names", "label_spec")
    }
    source = metadata_json.get("source_fingerprint") or {}
    held["source"] = [source.get("num_files"), source.get("num_bytes")]
    text = json.dumps(held, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def steps_per_epoch(num_examples, batch_size):
    """Batches of one epoch, the last one partial: `ceil(n / batch_size)`."""
    return -(-num_examples // batch_size)


def advance(position, batches, num_examples, batch_size, repeat):
    """The `Position` after `batches` more batches from `position`.

    Without `repeat` each epoch ends with its own (maybe partial) batch, so
    an epoch is `steps_per_epoch` batches. With `repeat` the epochs run on
    into each other, every batch is whole and one may hold two epochs'
    examples: the offset then counts examples across epochs.
    """
    if num_examples <= 0:
        return position
    epoch, offset = position.epoch, position.offset
    if repeat:
        epoch_more, offset = divmod(offset + batches * batch_size, num_examples)
        return Position(epoch + epoch_more, offset)
    per_epoch = steps_per_epoch(num_examples, batch_size)
    step = offset // batch_size + batches
    epoch_more, step = divmod(step, per_epoch)
    return Position(epoch + epoch_more, step * batch_size)


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """What a position of a stream means: a saved one may be used again only
    by a stream of the same spec (see `differences`).

    Attributes:
        split: the split or slice read (`"train"`, `"train[:10%]+val"`).
        export: what the export holds (see `export_identity`).
        num_examples: the examples of one epoch.
        batch_size: the global batch size.
        replicas: the strategy's replicas in sync.
        repeat: whether the epochs run on into each other.
        shuffle: whether each epoch is shuffled.
    """

    split: str
    export: str
    num_examples: int
    batch_size: int
    replicas: int
    repeat: bool
    shuffle: bool

    def to_json(self):
        return dataclasses.asdict(self)

    def differences(self, other):
        """The fields that differ from `other`'s, as `name: ours -> theirs`."""
        return [
            f"{field.name}: {getattr(other, field.name)!r} -> {getattr(self, field.name)!r}"
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(other, field.name)
        ]


_streams: "weakref.WeakValueDictionary[int, StreamState]" = weakref.WeakValueDictionary()
_counter = [0]
_counter_lock = threading.Lock()
# The number of the last shuffled split that is no stream, and why.
_unresumable: list = [0, None]


class StreamState:
    """The position and seed of one resumable stream, shared between its
    `tf.data` pipeline (which claims an epoch as each of its iterators
    starts: `claim`) and the `callbacks.BackupAndRestore` that saves and
    restores it.

    Args:
        spec: the stream's `StreamSpec`.
        seed: the stream's seed; None draws one, which is kept (and saved
            with a position), so that the stream can be resumed.
        limits: what a resumed stream does not repeat exactly, one phrase
            each (warned about by the callback).
    """

    def __init__(self, spec, seed=None, limits=()):
        self.spec = spec
        self.seed_given = seed is not None
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.limits = tuple(limits)
        self._next = Position()
        self._lock = threading.Lock()
        self.number = _number()
        _streams[self.number] = self

    def claim(self):
        """The `(epoch, offset, seed)` an iterator of the stream starts at;
        the next one starts at the next epoch's beginning."""
        with self._lock:
            start = self._next
            self._next = Position(start.epoch + 1, 0)
        return start.epoch, start.offset, self.seed

    def restore(self, position, seed):
        """The next iterator starts at `position`, with `seed`."""
        with self._lock:
            self._next = position
            self.seed = seed

    @property
    def next_position(self):
        with self._lock:
            return self._next


def _number():
    with _counter_lock:
        _counter[0] += 1
        return _counter[0]


def note_unresumable(reason):
    """A shuffled split was just built that is no resumable stream, because
    of `reason` (for example "tf.data service"): `latest_stream` is None
    until another stream is built."""
    _unresumable[:] = [_number(), reason]


def latest_stream():
    """`(stream, None)`: the resumable stream built last that is still
    alive; `(None, reason)` when a shuffled split built after it is not
    resumable (`note_unresumable`); `(None, None)` when there is none."""
    alive = sorted(_streams.items())
    number, reason = _unresumable
    if alive and alive[-1][0] > number:
        return alive[-1][1], None
    return None, reason
