"""TensorFlow's check of the stored images: what the export keeps, the reader decodes.

Pillow and TensorFlow decode with different libraries, or the same library
with other settings, and Pillow accepts files that TensorFlow refuses: a
JPEG with a marker inside its scan data (libjpeg's warning, which Pillow
ignores and TensorFlow treats as an error), a PNG whose image data lacks a
row (Pillow fills it in), a lossless JPEG. Such a file passed a Pillow-only
validation and stopped training in some epoch with a bare
`InvalidArgumentError`.

So each image is settled at export by a check at least as strict as
TensorFlow's decoder, or judged by that decoder itself:

- a JPEG stored as it is decodes with libjpeg-turbo in strict mode (no
  warning) at 1/8 scale (`encode._strict_jpeg_decodes`: the cost of the
  Pillow decode it replaces); a PNG's image data passes libpng's checks
  (`png_check.check_png_stream`). Those settle nearly every image, in the
  export's workers.
- the rest (a JPEG libjpeg warns about: TensorFlow reads some of those) are
  decoded here with the decoders the read path uses (`decode_jpeg`,
  `decode_png`) once their shard is written, and the shard is written
  again without any they refuse (`shard_writer.check_shard`).

Measured on 2,000 photo-like JPEGs (benchmarks/ab.py): decoding every image
with TensorFlow here cost 1.9x the export's CPU time (tf.data's parallel
map on top of decodes that Pillow had made in the workers), and 1.2x with
an eager loop; settling in the workers costs what Pillow's check did.
`tests/test_decodable.py` fuzzes the claim that a settled image decodes.

This module runs where TensorFlow may run: the exporting process and Beam
workers; never in a forked export worker.
"""

import re

import tensorflow as tf
from tensorflow.core.example import example_pb2


def image_refusal(data, image_format):
    """Why TensorFlow's decoders refuse stored image bytes (`image_format`
    "jpeg" or "png"), or `None`. A JPEG is decoded at 1/8 scale: libjpeg
    still entropy-decodes every block, which is where damage shows."""
    try:
        if image_format in ("png", b"png"):
            tf.io.decode_png(data)
        else:
            tf.io.decode_jpeg(data, ratio=8)
    except tf.errors.OpError as e:
        return f"TensorFlow's decoder refuses it ({bare_message(e.message)})"
    return None


def undecodable_records(path, names):
    """The images of a written shard, among those of the source files
    `names`, that TensorFlow refuses.

    The shard is read here, one record at a time, and only those images
    are decoded, one at a time: they are few (the export's own checks
    settle nearly all), and a huge one is never decoded beside another.

    Returns:
        `{source file (relative path): reason}`, empty when every one decodes.
    """
    refused = {}
    for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
        feature = example_pb2.Example.FromString(serialized).features.feature
        name = feature["source/filename"].bytes_list.value[0].decode("utf-8", "surrogateescape")
        if name not in names:
            continue
        reason = image_refusal(
            feature["image"].bytes_list.value[0], feature["image/format"].bytes_list.value[0]
        )
        if reason:
            refused[name] = reason
    return refused


def bare_message(message):
    """TensorFlow's message less the op it came from: `{{function_node
    __wrapped__IteratorGetNext...}} corrupted record at 27457 [Op:...]`
    -> `corrupted record at 27457`."""
    line = message.strip().splitlines()[0]
    line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line)
    return re.sub(r"\s*\[Op:[^\]]*\](\s*name:.*)?$", "", line)
