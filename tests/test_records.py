"""The shards' bytes: keras_datum's Example encoder and TFRecord writer against
TensorFlow's own."""

import os

import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from google.protobuf.internal import api_implementation
from hypothesis import strategies as st

from keras_datum import records

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Lengths past 127 and 16383 need two- and three-byte varints.
BYTES = st.one_of(st.binary(max_size=300), st.binary(min_size=16380, max_size=16400))
FLOATS = st.floats(width=32, allow_nan=False)
VALUES = {
    "string": st.one_of(BYTES, st.lists(BYTES, max_size=3)),
    "int64": st.lists(INT64, max_size=5),
    "float32": st.lists(FLOATS, max_size=5),
}
NAMES = st.text(min_size=1, max_size=12)


@st.composite
def examples(draw):
    dtypes = draw(st.dictionaries(NAMES, st.sampled_from(sorted(VALUES)), max_size=6))
    features = {name: draw(VALUES[dtype]) for name, dtype in dtypes.items()}
    return features, dtypes


def _tf_bytes(features, dtypes):
    """What TensorFlow's protobuf class serializes for the same features."""
    feature = {}
    for name, values in features.items():
        if dtypes[name] == "string":
            values = [values] if isinstance(values, bytes) else values
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        elif dtypes[name] == "int64":
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


@settings(max_examples=300, deadline=None)
@given(examples())
def test_example_bytes_equal_tensorflows_deterministic_serialization(example):
    if api_implementation.Type() != "upb":
        pytest.skip("map entry order is upb's; this protobuf runs another implementation")
    features, dtypes = example
    assert records.ExampleEncoder(dtypes)(features) == _tf_bytes(features, dtypes)


def test_example_bytes_parse_back_to_the_same_example():
    dtypes = {"image": "string", "image/format": "string", "image/height": "int64",
              "label": "int64", "objects/bbox": "float32", "é": "string"}
    features = {"image": b"\x89PNG", "image/format": b"png", "image/height": [32],
                "label": [-3, 2**40], "objects/bbox": [0.25, -1.5], "é": [b"", b"x"]}
    ours = records.ExampleEncoder(dtypes)(features)
    assert tf.train.Example.FromString(ours) == tf.train.Example.FromString(
        _tf_bytes(features, dtypes)
    )
    if api_implementation.Type() == "upb":
        # Keys that are prefixes of others ("image"), as the real ones are.
        assert ours == _tf_bytes(features, dtypes)


def test_example_encoder_skips_absent_features_and_refuses_unknown_ones():
    encoder = records.ExampleEncoder({"a": "int64", "b": "string"})
    assert encoder({"a": [1]}) == _tf_bytes({"a": [1]}, {"a": "int64"})
    with pytest.raises(KeyError, match="'c'"):
        encoder({"a": [1], "c": [2]})
    with pytest.raises(ValueError, match="out of range for int64"):
        encoder({"a": [2**63]})


def test_record_writer_writes_what_tensorflows_writer_writes(tmp_path):
    data = [b"", b"x", os.urandom(200), os.urandom(70_000)]
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as writer:
        for record in data:
            writer.write(record)
    with records.RecordWriter(str(tmp_path / "ours.tfrecord")) as writer:
        for record in data:
            writer.write(record)
    ours = (tmp_path / "ours.tfrecord").read_bytes()
    assert ours == (tmp_path / "tf.tfrecord").read_bytes()
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "ours.tfrecord"))]
    assert read == data


def test_record_writer_names_the_file_it_cannot_open(tmp_path):
    path = str(tmp_path / "missing" / "shard.tfrecord")
    with pytest.raises(OSError, match="missing/shard.tfrecord"):
        records.RecordWriter(path)
