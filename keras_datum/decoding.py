"""Serialized examples -> the problem's KerasCV dicts, and the read path's
pixel casts (graph code: see `pipeline`)."""

import tensorflow as tf

from keras_datum import cache
from keras_datum import datum_format
from keras_datum import problems

_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
PIXEL_KEYS = ("images", "segmentation_masks")
# Resize methods whose output stays within its input's range (weighted
# averages with non-negative weights): their pixels need no clipping to fit
# uint8 again.
_CONVEX_INTERPOLATIONS = ("bilinear", "nearest", "area")


def parse_spec(features):
    """The `tf.io.parse_single_example` spec for the metadata's feature spec.

    The source file name is stored for reports and debugging, not read back:
    parsing it for every example would be work thrown away.
    """
    spec = {}
    for name, feature in features.items():
        if name in cache.SOURCE_FEATURES:
            continue
        dtype = _DTYPES[feature["dtype"]]
        if feature["shape"] is None:
            spec[name] = tf.io.VarLenFeature(dtype)
        else:
            spec[name] = tf.io.FixedLenFeature(feature["shape"], dtype)
    return spec


def decode_example(serialized, meta, options, seed=None):
    """One serialized example -> the problem's KerasCV dict; `seed`, its
    crop seed with `options.random_resized_crop` (see `crop`)."""
    if meta.in_place:  # A datum export.
        parsed = datum_format.parse_example(serialized, meta.json)
        return problems.get(meta.problem).decode(parsed, meta.json, options, seed)
    parsed = tf.io.parse_single_example(serialized, parse_spec(meta.features))
    parsed = {
        k: tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v
        for k, v in parsed.items()
    }
    return problems.get(meta.problem).decode(parsed, meta.json, options, seed)


def unchanged(inputs):
    return inputs


def pixels_as(dtype, interpolation=None):
    """Casts the pixels of an element to `dtype` (uint8: rounded, and clipped
    unless `interpolation` cannot leave [0, 255]); pixels already in `dtype`
    are left alone."""

    def cast(inputs):
        inputs = dict(inputs)
        for key in PIXEL_KEYS:
            if key in inputs and inputs[key].dtype != dtype:
                value = inputs[key]
                if dtype == tf.uint8:
                    inputs[key] = rounded_uint8(value, interpolation)
                else:
                    inputs[key] = tf.cast(value, dtype)
        return inputs

    return cast


def rounded_uint8(value, interpolation=None):
    """Float pixels as uint8: rounded, and clipped to [0, 255] unless they
    come straight from a resize by `interpolation` that cannot leave it."""
    if interpolation not in _CONVEX_INTERPOLATIONS:
        value = tf.clip_by_value(value, 0.0, 255.0)
    return tf.cast(tf.round(value), tf.uint8)
