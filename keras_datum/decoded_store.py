"""The decoded cache of a resumable stream: decoded examples by record id.

A stream reads its records in a new order every epoch (see `streams`), so
its cache must be read in any order too: `DecodedStore` keeps each decoded
example (uint8 pixels at the target size, its labels) in NumPy arrays, one
row per record, filled as the examples are decoded. Once every record is
in, an epoch gathers its batches from the arrays and decodes nothing. Only
examples of fixed shapes are kept (`storable`): classification and
segmentation.
"""

import concurrent.futures
import threading

import numpy as np
import tensorflow as tf


def storable(spec):
    """Whether examples of the element spec `spec` (a structure of
    `tf.TensorSpec`s, one example's) have fixed shapes."""
    return all(
        isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
        for s in tf.nest.flatten(spec)
    )


class DecodedStore:
    """Decoded examples of a stream, by record id.

    Args:
        num_examples: the records of the stream.
        spec: one example's element spec (see `storable`).
    """

    def __init__(self, num_examples, spec):
        self.spec = spec
        self._specs = tf.nest.flatten(spec)
        # Reserved, not touched: memory is taken as examples come in.
        self._arrays = [
            np.empty((num_examples, *s.shape), s.dtype.as_numpy_dtype) for s in self._specs
        ]
        self._filled = np.zeros(num_examples, bool)
        self._lock = threading.Lock()
        # Batches are copied in by one thread of their own, off the read
        # path: the first write to the reserved rows costs page faults (the
        # rows of a shuffled batch lie in as many fresh pages as it has
        # examples), which the first batch of an epoch would otherwise wait
        # for. One worker keeps the writes in order.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "keras_datum_store")

    def _write(self, ids, fields):
        with self._lock:
            for array, field in zip(self._arrays, fields):
                array[ids] = field
            self._filled[ids] = True

    def _put(self, ids, *fields):
        # The tensors' buffers are TensorFlow's only for this call: copies go.
        self._writer.submit(self._write, np.array(ids), [np.array(f) for f in fields])
        return np.int64(len(ids))

    def _complete(self):
        self._writer.submit(lambda: None).result()  # The writes so far are in.
        with self._lock:
            return np.bool_(self._filled.all())

    def _get(self, ids):
        with self._lock:
            return tuple(array[ids] for array in self._arrays)

    def complete(self):
        """A graph op: whether every record is in."""
        done = tf.numpy_function(self._complete, [], tf.bool, stateful=True)
        return tf.reshape(done, [])

    def put(self, batch, ids):
        """`batch` (a structure of batched tensors of `spec`), stored as the
        records `ids`, then passed on."""
        flat = tf.nest.flatten(batch)
        stored = tf.numpy_function(self._put, [ids, *flat], tf.int64, stateful=True)
        with tf.control_dependencies([stored]):
            return tf.nest.map_structure(tf.identity, batch)

    def get(self, ids):
        """The batch of the records `ids`, as `spec` batched."""
        flat = tf.numpy_function(
            self._get, [ids], [s.dtype for s in self._specs], stateful=True
        )
        for tensor, spec in zip(flat, self._specs):
            tensor.set_shape([None, *spec.shape])
        return tf.nest.pack_sequence_as(self.spec, flat)
