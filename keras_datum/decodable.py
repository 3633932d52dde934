"""TensorFlow's check of the stored images: what the export keeps, the reader decodes.

Pillow and TensorFlow decode with different libraries, or the same library
with other settings, and Pillow accepts files that TensorFlow refuses: a
JPEG with a marker inside its scan data (libjpeg's warning, which Pillow
ignores and TensorFlow treats as an error), a PNG whose image data lacks a
row (Pillow fills it in), a lossless JPEG. Such a file passed a Pillow-only
validation and stopped training in some epoch with a bare
`InvalidArgumentError`. So once a shard is written, the export decodes its
images here with the decoders the read path uses (`decode_jpeg`,
`decode_png`), and writes the shard again without any it refuses.

JPEGs are decoded at 1/8 scale (`ratio=8`): libjpeg still entropy-decodes
every block, which is where damage shows, and skips most of the inverse
transforms. It costs about what Pillow's 1/8-scale decode did at export,
which it replaces. PNGs whose raw pixels are stored (small ones) are not
decoded: their image data was checked as libpng checks it when they were
read (`encode.check_png_stream`), which costs a fraction of a TensorFlow
decode for a tiny image.

This module runs where TensorFlow may run: the exporting process, its
threads, and Beam workers; never in a forked export worker.
"""

import re

import tensorflow as tf

from keras_datum import encode

_SPEC = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "image/format": tf.io.FixedLenFeature([], tf.string),
    "image/pixels": tf.io.FixedLenFeature([], tf.string, default_value=""),
    "source/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
}
# Indices of the records that decode, gathered this many at a time.
_BATCH = 4096


def _checked_size(serialized):
    """Decodes one record's image as the read path would; 0 when it need
    not be decoded. Raises TensorFlow's error for an image it refuses."""
    parsed = tf.io.parse_single_example(serialized, _SPEC)
    return _decoded_size(parsed["image"], parsed["image/format"], parsed["image/pixels"])


def _decoded_size(data, image_format, pixels):
    def jpeg():
        return tf.size(tf.io.decode_jpeg(data, ratio=8))

    def png():
        return tf.size(tf.io.decode_png(data))

    def settled():
        return tf.constant(0)

    is_png = tf.equal(image_format, "png")
    has_pixels = tf.strings.length(pixels) > 0
    return tf.cond(
        is_png & has_pixels, settled, lambda: tf.cond(is_png, png, jpeg)
    )


def image_refusal(data, image_format, pixels=b""):
    """Why TensorFlow refuses stored image bytes (`image_format` "jpeg" or
    "png"; PNGs with raw `pixels` are not decoded), or `None`."""
    try:
        _decoded_size(*(tf.convert_to_tensor(v, tf.string) for v in (data, image_format, pixels)))
    except tf.errors.OpError as e:
        return f"TensorFlow's decoder refuses it ({bare_message(e.message)})"
    return None


def _decoded_indices(path, parallel):
    """Indices (in file order) of the records of shard `path` that decode,
    `parallel` at a time (`tf.data.AUTOTUNE`: as many as there are cores)."""
    dataset = tf.data.TFRecordDataset(path).enumerate()
    dataset = dataset.map(
        lambda index, serialized: (index, _checked_size(serialized)),
        num_parallel_calls=parallel,
        deterministic=False,
    )
    dataset = dataset.ignore_errors().map(lambda index, _: index).batch(_BATCH)
    return {int(i) for block in dataset.as_numpy_iterator() for i in block}


def undecodable_records(path, num_records, largest_pixels=0):
    """The records of a written shard whose image TensorFlow refuses.

    Args:
        path: a shard written by the export (`image` features).
        num_records: how many records it holds.
        largest_pixels: the most pixels a stored image of the shard has. A
            shard with an image whose decode (4 bytes a pixel at most)
            takes more than `encode.HUGE_IMAGE_BYTES` is decoded one image
            at a time, as the export workers decode such images.

    Returns:
        `{source file (relative path): reason}`, empty when every image decodes.
    """
    huge = 4 * largest_pixels > encode.HUGE_IMAGE_BYTES
    decoded = _decoded_indices(path, 1 if huge else tf.data.AUTOTUNE)
    if len(decoded) == num_records:
        return {}
    refused = {}
    records = tf.data.TFRecordDataset(path).enumerate().as_numpy_iterator()
    for index, serialized in records:
        if index in decoded:
            continue
        parsed = tf.io.parse_single_example(serialized, _SPEC)
        name = parsed["source/filename"].numpy().decode("utf-8", "surrogateescape")
        refused[name] = refusal(serialized)
    return refused


def refusal(serialized):
    """Why TensorFlow refuses a record's image, in its own words."""
    parsed = tf.io.parse_single_example(serialized, _SPEC)
    found = image_refusal(parsed["image"], parsed["image/format"], parsed["image/pixels"])
    # Decodes alone but not in the dataset (a transient failure): refused
    # all the same, since the read path met the same failure.
    return found or "TensorFlow's decoder refuses it"


def bare_message(message):
    """TensorFlow's message less the op it came from: `{{function_node
    __wrapped__IteratorGetNext...}} corrupted record at 27457 [Op:...]`
    -> `corrupted record at 27457`."""
    line = message.strip().splitlines()[0]
    line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line)
    return re.sub(r"\s*\[Op:[^\]]*\](\s*name:.*)?$", "", line)
