"""The bytes of the shards: `tf.train.Example` messages and TFRecord files.

Export workers build every example and frame every record here, in plain
Python, without TensorFlow and without building protobuf objects:

- `ExampleEncoder` gives exactly the bytes that
  `tf.train.Example(...).SerializeToString(deterministic=True)` gives for the
  same features (map entries in key order), in about a third of the time. So
  the local exporter, Beam workers and any process write the same bytes.
- `RecordWriter` writes the TFRecord framing (length, masked CRC-32C of the
  length, data, masked CRC-32C of the data), exactly as `tf.io.TFRecordWriter`
  does without compression. It needs no TensorFlow runtime, so forked export
  workers can write whole shards themselves.

`tests/test_records.py` compares both with TensorFlow's own.
"""

import functools
import struct

import google_crc32c
import numpy as np

from keras_datum import storage

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MASK_DELTA = 0xA282EAD8


# Varints of lengths and small values, looked up instead of computed.
_SMALL = 1 << 14


def _varint(value):
    """A protobuf base-128 varint; a negative int64 as its 64-bit two's complement."""
    if 0 <= value < _SMALL:
        return _SMALL_VARINTS[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compute_small():
    table = []
    for value in range(_SMALL):
        table.append(bytes((value,)) if value < 0x80 else bytes((value & 0x7F | 0x80, value >> 7)))
    return table


_SMALL_VARINTS = _compute_small()


def _int64s(values):
    for value in values:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"Value out of range for int64: {value}")
    return b"".join([_varint(int(v)) for v in values])


def _bytes_list(values):
    if isinstance(values, bytes):
        return b"\x0a" + _varint(len(values)) + values
    return b"".join([b"\x0a" + _varint(len(v)) + bytes(v) for v in values])


def _int64_list(values):
    if not len(values):
        return b""
    packed = _int64s(values)
    return b"\x0a" + _varint(len(packed)) + packed


def _float_list(values):
    # float32, little-endian, as protobuf stores floats.
    packed = np.asarray(values, dtype="<f4").tobytes()
    return b"\x0a" + _varint(len(packed)) + packed if packed else b""


# tf.train.Feature: (its field's tag, the list's encoder), by stored dtype.
_KINDS = {"string": (b"\x0a", _bytes_list), "int64": (b"\x1a", _int64_list)}
_FLOAT_KIND = (b"\x12", _float_list)


class ExampleEncoder:
    """Serializes `tf.train.Example`s with a fixed set of features.

    `encoder(features)` gives exactly what `tf.train.Example` with those
    features gives from `SerializeToString(deterministic=True)`.

    Args:
        dtypes: `{name: "string" | "int64" | "float32"}` for every feature.
            A `"string"` feature's value is bytes or a list of bytes, the
            others' are lists of numbers.
    """

    def __init__(self, dtypes):
        self._names = sorted(dtypes, key=functools.cmp_to_key(_upb_key_order))
        self._fields = []
        for name in self._names:
            key = name.encode("utf-8")
            tag, encode = _KINDS.get(dtypes[name], _FLOAT_KIND)
            self._fields.append((name, b"\x0a" + _varint(len(key)) + key + b"\x12", tag, encode))

    def __call__(self, features):
        entries = []
        for name, prefix, tag, encode in self._fields:
            if name not in features:
                continue
            inner = encode(features[name])
            feature = tag + _varint(len(inner)) + inner
            entry = prefix + _varint(len(feature)) + feature
            entries.append(b"\x0a" + _varint(len(entry)) + entry)
        if len(entries) != len(features):
            unknown = sorted(set(features) - set(self._names))
            raise KeyError(f"Features without a dtype: {unknown}")
        message = b"".join(entries)
        return b"\x0a" + _varint(len(message)) + message


def _upb_key_order(a, b):
    """The map key order of protobuf's deterministic serialization (upb, its
    default implementation): bytewise, except that a key comes after the
    longer keys it is a prefix of ("image/format" before "image")."""
    a, b = a.encode("utf-8"), b.encode("utf-8")
    common = min(len(a), len(b))
    if a[:common] != b[:common]:
        return -1 if a[:common] < b[:common] else 1
    return len(b) - len(a)


def masked_crc(data):
    crc = google_crc32c.value(data)
    return ((crc >> 15 | crc << 17) + _MASK_DELTA) & 0xFFFFFFFF


# A shard's local file is written through a buffer this big: with the
# default 8 KB, records of tiny images (a few KB) cost a write system call
# each, a few percent of their export.
WRITE_BUFFER_BYTES = 1 << 20


class RecordWriter:
    """Writes one uncompressed TFRecord file (a context manager).

    Local paths are written with Python's own files; URLs through
    TensorFlow's file systems (`storage.open`). A failed local write (a full
    disk) raises an `OSError` that names the file.
    """

    def __init__(self, path):
        self.path = path
        try:
            self._file = storage.open(path, "wb", buffering=WRITE_BUFFER_BYTES)
        except OSError as e:
            raise self._naming_path(e) from e

    def write(self, record):
        length = struct.pack("<Q", len(record))
        try:
            # Into the file's buffer piece by piece: joining them first
            # would copy the record once more.
            self._file.write(length + struct.pack("<I", masked_crc(length)))
            self._file.write(record)
            self._file.write(struct.pack("<I", masked_crc(record)))
        except OSError as e:
            raise self._naming_path(e) from e

    def close(self):
        try:
            self._file.close()
        except OSError as e:
            raise self._naming_path(e) from e

    def _naming_path(self, error):
        return OSError(error.errno, f"{error.strerror or error} while writing {self.path!r}",
                       self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
