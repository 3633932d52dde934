"""The decoded cache of a resumable stream: decoded examples by record id.

A stream reads its records in a new order every epoch (see `streams`), so
its cache must be read in any order too: `DecodedStore` keeps each decoded
example (uint8 pixels at the target size, its labels) by record id, filled
as the examples are decoded. Once every record is in, an epoch gathers its
batches from it and decodes nothing. Only examples of fixed shapes are kept
(`Problem.fixed_examples`): classification and segmentation.

The examples live in TensorFlow hash tables (one per field, each example's
bytes as a row of int64 words), so that filling and gathering are graph ops:
no Python, and no lock, on the read path.
"""

import numpy as np
import tensorflow as tf

_WORD = 8  # Bytes in an int64 word.


class _Field:
    """One field of the examples (a fixed shape and dtype) as rows of int64
    words in a hash table keyed by record id."""

    def __init__(self, spec):
        self.spec = spec
        self._kept = tf.uint8 if spec.dtype == tf.bool else spec.dtype
        self._bytes = int(np.prod(spec.shape, dtype=np.int64)) * self._kept.size
        self._words = -(-self._bytes // _WORD)
        self.table = tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.int64, default_value=tf.zeros([self._words], tf.int64)
        )

    def insert(self, ids, values):
        raw = tf.cast(values, self._kept) if self.spec.dtype == tf.bool else values
        if self._kept != tf.uint8:
            raw = tf.bitcast(raw, tf.uint8)
        raw = tf.reshape(raw, [-1, self._bytes])
        if self._words * _WORD > self._bytes:
            raw = tf.pad(raw, [[0, 0], [0, self._words * _WORD - self._bytes]])
        return self.table.insert(ids, tf.bitcast(tf.reshape(raw, [-1, self._words, _WORD]), tf.int64))

    def lookup(self, ids):
        raw = tf.reshape(tf.bitcast(self.table.lookup(ids), tf.uint8), [-1, self._words * _WORD])
        if self._words * _WORD > self._bytes:
            raw = raw[:, : self._bytes]
        shape = [-1, *self.spec.shape]
        if self._kept == tf.uint8:
            values = tf.reshape(raw, shape)
        else:
            values = tf.bitcast(tf.reshape(raw, [*shape, self._kept.size]), self._kept)
        return tf.cast(values, tf.bool) if self.spec.dtype == tf.bool else values


class DecodedStore:
    """Decoded examples of a stream, by record id.

    Args:
        num_examples: the records of the stream.
        spec: one example's element spec, of fixed shapes.
    """

    def __init__(self, num_examples, spec):
        self.spec = spec
        self.num_examples = num_examples
        self._fields = [_Field(s) for s in tf.nest.flatten(spec)]

    def complete(self):
        """A graph op: whether every record is in."""
        return tf.equal(self._fields[0].table.size(), self.num_examples)

    def put(self, batch, ids):
        """`batch` (a structure of batched tensors of `spec`), stored as the
        records `ids`, then passed on."""
        flat = tf.nest.flatten(batch)
        inserted = [field.insert(ids, values) for field, values in zip(self._fields, flat)]
        with tf.control_dependencies(inserted):
            return tf.nest.map_structure(tf.identity, batch)

    def get(self, ids):
        """The batch of the records `ids`, as `spec` batched."""
        return tf.nest.pack_sequence_as(self.spec, [f.lookup(ids) for f in self._fields])
