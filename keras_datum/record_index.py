"""Random access into a split's shard files: where every record starts.

A TFRecord file is a run of records, each a 12-byte header (the data's
length as a little-endian uint64, then its masked CRC), the data, and a
4-byte CRC of the data. `offsets` finds where each record starts by reading
the headers only (a seek and 12 bytes per record), so any record can then
be read with one positioned read. The offsets are found on first use, in
memory, keyed by the file's size and modification time: nothing is written
next to the shards, so caches exported before random access existed, and
datum exports read in place (which are the user's files), get it the same
way, and an index can never be stale.

`RecordTable` numbers the records of a list of shard files (a split, or the
slices of several) 0..n-1 in stored order, and reads any set of them
(`read`, called from the read path through `tf.numpy_function`).
"""

import dataclasses
import functools
import struct
import threading

import numpy as np
import tensorflow as tf

from keras_datum import records
from keras_datum import storage

HEADER_BYTES = 12
FOOTER_BYTES = 4
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_lock = threading.Lock()
_memo: dict = {}


class DamagedShardError(ValueError):
    """A shard file does not hold the records the metadata says it does.
    (A ValueError: through `tf.numpy_function` it arrives as TensorFlow's
    InvalidArgumentError, as the sequential reader's checks do.)"""


_VERIFY = "Run `keras-datum verify` on the cache, then export again."


def _open(path):
    if storage.is_url(path):
        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb", buffering=0)


def _scan(path, count, size):
    """The start of each of the `count` records of `path` (`size` bytes),
    and `size` last: record `i` spans `offsets[i]:offsets[i + 1]`."""
    offsets = np.empty(count + 1, np.int64)
    position = 0
    with _open(path) as handle:
        for index in range(count):
            offsets[index] = position
            handle.seek(position)
            header = handle.read(HEADER_BYTES)
            if len(header) < HEADER_BYTES:
                raise DamagedShardError(
                    f"Shard {path} is damaged: it holds {index} of its {count} records. "
                    f"{_VERIFY}"
                )
            position += HEADER_BYTES + _LENGTH.unpack_from(header)[0] + FOOTER_BYTES
            if position > size:
                break
    if position != size:
        raise DamagedShardError(
            f"Shard {path} is damaged: its {count} records do not fill its {size} bytes. "
            f"{_VERIFY}"
        )
    offsets[count] = size
    return offsets


def offsets(path, count):
    """Where each of the `count` records of shard `path` starts, then the
    file's size (see `_scan`); found once per process for each version of
    the file.

    Raises:
        DamagedShardError: the file is missing, or its records do not fit
            its size; the message names it.
    """
    try:
        key = (path, *storage.stat(path), count)
    except FileNotFoundError:
        raise DamagedShardError(f"Shard {path} is missing. {_VERIFY}") from None
    with _lock:
        found = _memo.get(key)
    if found is None:
        found = _scan(path, count, key[1])
        with _lock:
            _memo[key] = found
    return found


@dataclasses.dataclass(frozen=True)
class Segment:
    """Records `start`..`stop` (stop excluded) of one shard file."""

    path: str
    count: int
    start: int
    stop: int


def _checked(raw, path, index, count):
    """The data of the record `raw` (header, data, footer), once its length
    and CRCs are checked."""
    data = raw[HEADER_BYTES:-FOOTER_BYTES]
    if (
        len(raw) < HEADER_BYTES + FOOTER_BYTES
        or _LENGTH.unpack_from(raw)[0] != len(data)
        or _CRC.unpack_from(raw, 8)[0] != records.masked_crc(raw[:8])
        or _CRC.unpack_from(raw, len(raw) - FOOTER_BYTES)[0] != records.masked_crc(data)
    ):
        raise DamagedShardError(f"Shard {path} is damaged at record {index} of its {count}. {_VERIFY}")
    return data


class RecordTable:
    """The records of `segments`, numbered 0..n-1 in stored order.

    Args:
        segments: `Segment`s, in order.
        share: `(index, count)`: the table holds only every `count`-th of
            the records from the `index`-th (one of `count` workers' share),
            numbered 0.. in order.
    """

    def __init__(self, segments, share=(0, 1)):
        self.segments = tuple(s for s in segments if s.stop > s.start)
        sizes = [s.stop - s.start for s in self.segments]
        # The first id of each segment, and n last.
        self._firsts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self.share = share
        self.num_examples = len(range(share[0], int(self._firsts[-1]), share[1]))

    @classmethod
    def of_shards(cls, paths, counts):
        """The table of whole shard files."""
        return cls(Segment(p, c, 0, c) for p, c in zip(paths, counts))

    @functools.cached_property
    def _offsets(self):
        return [offsets(s.path, s.count) for s in self.segments]

    def shared(self, index, count):
        """This table's share for worker `index` of `count`."""
        return RecordTable(self.segments, (index, count))

    def locate(self, ids):
        """`(segment, index in its shard)` of each of `ids`."""
        ids = np.asarray(ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_examples):
            raise IndexError(f"Record ids must be in [0, {self.num_examples}).")
        ids = self.share[0] + ids * self.share[1]
        segment = np.searchsorted(self._firsts, ids, side="right") - 1
        starts = np.array([s.start for s in self.segments], np.int64)
        return segment, ids - self._firsts[segment] + starts[segment]

    def read(self, ids):
        """The serialized records `ids` (an object array of bytes), with the
        index of each one's segment and its index in its shard."""
        segment, index = self.locate(ids)
        records = np.empty(len(segment), object)
        for number in np.unique(segment):
            where = np.flatnonzero(segment == number)
            records[where] = self._read_from(int(number), index[where])
        return records, segment, index

    def _read_from(self, number, indices):
        """Records `indices` of segment `number`: one positioned read each,
        with the length and both CRCs checked, as TensorFlow's reader does
        (its own random reader costs more to open than a batch's reads)."""
        path = self.segments[number].path
        table = self._offsets[number]
        try:
            handle = _open(path)
        except (FileNotFoundError, tf.errors.NotFoundError):
            raise DamagedShardError(f"Shard {path} is missing. {_VERIFY}") from None
        with handle:
            out = []
            for index in indices:
                start, stop = int(table[index]), int(table[index + 1])
                handle.seek(start)
                out.append(_checked(handle.read(stop - start), path, index, len(table) - 1))
        return out

    def paths(self):
        """Each segment's shard file."""
        return [s.path for s in self.segments]
