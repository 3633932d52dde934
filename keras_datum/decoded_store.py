"""The decoded cache of a resumable stream: decoded examples by record id.

A stream reads its records in a new order every epoch (see `streams`), so
its cache must be read in any order too: `DecodedStore` keeps each decoded
example (uint8 pixels at the target size, its labels) by record id, filled
as the examples are decoded. Once every record is in, an epoch gathers its
batches from it and decodes nothing. Only examples of fixed shapes are kept
(`Problem.fixed_examples`): classification and segmentation.

Each field of the examples is one array of rows, indexed by record id, held
in a TensorFlow resource variable (made with the raw ops, so that no
distribution strategy's scope turns it into a distributed variable), and a
hash table counts the records in: filling and gathering are graph ops, no
Python on the read path, and a batch is gathered row by row as whole rows.
The array is allocated uninitialized: its memory is taken as rows are
written, as the epoch that fills it decodes them.
"""

import tensorflow as tf
from tensorflow.python.eager import context


class _Field:
    """One field of the examples (a fixed shape and dtype): an array of
    rows, one per record id, in a resource variable that lives as long as
    its handle (an anonymous resource)."""

    def __init__(self, spec, num_examples):
        self.spec = spec
        self._kept = tf.uint8 if spec.dtype == tf.bool else spec.dtype
        shape = [num_examples, *spec.shape]
        with tf.init_scope():
            self.rows = tf.raw_ops.VarHandleOp(
                dtype=self._kept, shape=shape, shared_name=context.anonymous_name()
            )
            tf.raw_ops.AssignVariableOp(
                resource=self.rows,
                value=tf.raw_ops.Empty(shape=shape, dtype=self._kept, init=False),
            )

    def insert(self, ids, values):
        raw = tf.cast(values, self._kept) if self.spec.dtype == tf.bool else values
        return tf.raw_ops.ResourceScatterUpdate(resource=self.rows, indices=ids, updates=raw)

    def lookup(self, ids):
        values = tf.raw_ops.ResourceGather(resource=self.rows, indices=ids, dtype=self._kept)
        values = tf.ensure_shape(values, [None, *self.spec.shape])
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
        self._fields = [_Field(s, num_examples) for s in tf.nest.flatten(spec)]
        # The record ids in: its size says when every record is.
        self._ids = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)

    def complete(self):
        """A graph op: whether every record is in."""
        return tf.equal(self._ids.size(), self.num_examples)

    def put(self, batch, ids):
        """`batch` (a structure of batched tensors of `spec`), stored as the
        records `ids`, then passed on."""
        flat = tf.nest.flatten(batch)
        inserted = [field.insert(ids, values) for field, values in zip(self._fields, flat)]
        # Counted once the rows are written: a reader that sees every record
        # in finds every row.
        with tf.control_dependencies(inserted):
            counted = self._ids.insert(ids, tf.ones(tf.shape(ids), tf.int64))
        with tf.control_dependencies([counted]):
            return tf.nest.map_structure(tf.identity, batch)

    def get(self, ids):
        """The batch of the records `ids`, as `spec` batched."""
        return tf.nest.pack_sequence_as(self.spec, [f.lookup(ids) for f in self._fields])
