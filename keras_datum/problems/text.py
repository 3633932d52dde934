"""Text classification: folders of `.txt` files, and datum's JSON layout.

```
class folders (as text_dataset_from_directory)     datum's JSON layout
root/                                              root/
  pos/ 0001.txt ...                                  train.json
  neg/ 0002.txt ...                                  val.json  (optional)
(or train/, val/, test/ each holding class folders)  test.json (optional)
```

A datum JSON file maps ids to `{"text": "...", "label": {"<name>": value}}`;
the one label key's values are class indices or class names. `y` follows
`label_mode` as for images; `x` is the raw string, ready for
`TextVectorization` or a KerasHub preprocessor.
"""

import os

import numpy as np
import tensorflow as tf

from keras_datum import errors
from keras_datum import sources
from keras_datum import storage
from keras_datum.problems import base
from keras_datum.problems import classification
from keras_datum.problems import labels
from keras_datum.sources import ExampleRecord
from keras_datum.sources import Layout

NAME = "text"
TEXT_FORMATS = (".txt",)
_JSON_SPLITS = sources.SPLIT_NAMES


def find_layout(root, follow_links=False):
    if storage.is_any_file(os.path.join(root, "train.json")):
        return _find_json(root)
    if not _has_text_files(root, follow_links):
        return None
    return classification.find_folder_layout(
        root, follow_links, formats=TEXT_FORMATS, problem=NAME, what="text files"
    )


def find_unlabelled_layout(root, follow_links=False):
    """`label_mode=None`: datum's JSON layout as it is, else every `.txt`
    file below `root` (when it holds no image)."""
    if storage.is_any_file(os.path.join(root, "train.json")):
        return _find_json(root)
    for _ in sources.iter_image_files(root, follow_links):
        return None  # Images: not a text folder.
    return classification.find_files_layout(root, follow_links, TEXT_FORMATS, NAME)


def _has_text_files(root, follow_links):
    """Class (or split) folders with `.txt` files and no images."""
    found_text = False
    for dirpath, dirs, files in storage.walk(root, followlinks=follow_links):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if dirpath == root:
            continue
        for name in files:
            lower = name.lower()
            if lower.endswith(sources.IMAGE_FORMATS):
                return False
            found_text |= lower.endswith(TEXT_FORMATS)
    return found_text


def why_not(root, follow_links=False):
    """An image among the text files, or no `.txt` file at all (Keras's
    "No text files found"), named."""
    for dirpath, dirs, files in storage.walk(root, followlinks=follow_links):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in sorted(files):
            if name.lower().endswith(sources.IMAGE_FORMATS):
                path = os.path.join(dirpath, name)
                return f"{path!r} is an image, and a text dataset's folders hold .txt files only."
    if not _has_text_files(root, follow_links):
        return f"No text files found in directory {root!r}. Allowed format: .txt."
    return None


def parse_datum_json(path):
    """Returns [(id, label key, label value, text)] from one datum JSON file.

    Raises:
        ValueError: malformed JSON or an entry without `text` and one label;
            names the file and the id.
    """
    data = sources.read_json_object(path, "an object mapping ids to examples")
    rows = []
    for example_id, example in data.items():
        where = f"{path}: example {example_id!r}"
        if not isinstance(example, dict) or not isinstance(example.get("text"), str):
            raise ValueError(f"{where} needs a string 'text'.")
        label = example.get("label")
        if not isinstance(label, dict) or len(label) != 1:
            raise ValueError(f"{where} needs a 'label' object with one key.")
        (key, value), = label.items()
        if isinstance(value, str):
            value = labels.parse_label_cell(value, where)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(
                f"{where}: label {key!r} must be a class index or name. "
                f"Received: {value!r}"
            )
        rows.append((str(example_id), key, value, example["text"]))
    return rows


def _find_json(root):
    rows_by_split, extra = {}, []
    for file_split, split in _JSON_SPLITS.items():
        path = os.path.join(root, file_split + ".json")
        if not storage.is_any_file(path):
            continue
        if split in rows_by_split:
            raise ValueError(f"{root!r} has both val.json and validation.json; keep one.")
        extra.append(path)
        rows_by_split[split] = (path, parse_datum_json(path))
    all_rows = [row for _, rows in rows_by_split.values() for row in rows]
    keys = {key for _, key, _, _ in all_rows}
    if len(keys) > 1:
        raise ValueError(
            f"The JSON files in {root!r} use several label keys {sorted(keys)}; "
            "keras_datum reads one label per text."
        )
    values = [value for _, _, value, _ in all_rows]
    if all(isinstance(v, int) for v in values):
        # Checked before the class list is built: a label of 2,000,000,000
        # (an id taken for the label) would make one of gigabytes.
        num_classes = labels.check_class_labels(
            (
                (value, f"{path}: example {example_id!r}")
                for path, rows in rows_by_split.values()
                for example_id, _, value, _ in rows
            ),
            len(values),
        )
        class_names = [str(i) for i in range(num_classes)]
        index = {v: v for v in values}
    elif all(isinstance(v, str) for v in values):
        class_names = sorted(set(values))
        index = {name: i for i, name in enumerate(class_names)}
    else:
        raise ValueError(
            f"The labels in {root!r} must all be class indices (integers >= 0) "
            "or all class names (strings)."
        )
    splits = {
        split: [
            ExampleRecord(
                path=path,
                relpath=f"{os.path.basename(path)}#{example_id}",
                labels={"label": [index[value]]},
                stratum=index[value],
                annotation=text,
            )
            for example_id, _, value, text in rows
        ]
        for split, (path, rows) in rows_by_split.items()
    }
    return Layout(
        name="datum_json",
        problem=NAME,
        splits=splits,
        info=labels.class_info(class_names),
        extra_files=extra,
    )


# --- Export -------------------------------------------------------------------


def features(info):
    return {"text": {"dtype": "string", "shape": []}, **labels.label_features(info)}


def encode(record, options):
    """Reads one text (a file, or a JSON entry); it must be UTF-8."""
    if record.annotation is not None:
        data = record.annotation.encode("utf-8")
    else:
        try:
            data = storage.read_bytes(record.path)
        except OSError as e:
            raise errors.InvalidExampleError(f"cannot read file: {e.strerror or e}") from e
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise errors.InvalidExampleError(f"not UTF-8 text ({e})") from None
    return {"text": data, **record.labels}, {"characters": len(data)}


# --- Reading ----------------------------------------------------------------


def check_read_options(info, options):
    if options.image_dtype is not None:
        raise ValueError(
            "`image_dtype` applies to images; this is a text dataset without "
            f"images. Received: image_dtype={options.image_dtype!r}"
        )
    labels.check_label_mode(info, options)


def check_augmentation(augmentation, options):
    """Refuses image layers: a text example has no image."""
    from keras_datum import augment

    for layer in augmentation.layers:
        if augment.is_image_layer(layer):
            raise ValueError(
                f"The {augmentation.argument} layer {type(layer).__name__} "
                f"(name={layer.name!r}) works on images, and this dataset is text. "
                "Pass a function that takes and returns the example dict "
                "{'text': ..., 'labels': ...} instead."
            )


def _cut(text, options):
    """`text` cut to `max_length` bytes, as Keras cuts (a character may be
    cut in two, as there); the buckets count the words of the cut text."""
    if options.max_length is None:
        return text
    return tf.strings.substr(text, 0, options.max_length)


def decode(parsed, info, options, seed=None):
    return labels.with_labels({"text": _cut(parsed["text"], options)}, parsed, info, options)


def batch(dataset, batch_size, options):
    """Plain batches, or length buckets (datum's `bucket_by_sequence_length`)."""
    boundaries = options.bucket_boundaries
    if batch_size is None:
        return dataset
    if not boundaries:
        return dataset.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.bucket_by_sequence_length(
        element_length_func=lambda inputs: tf.size(_words(inputs["text"])),
        bucket_boundaries=list(boundaries),
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
    )


def _words(text):
    """The length `bucket_boundaries` counts: whitespace-separated words."""
    return tf.strings.split(text)


_BATCH_COUNTS: dict[tuple, int] = {}


def batch_count(paths, batch_size, options):
    """How many batches `batch` makes of one pass over the shards `paths`,
    or None when `batch` keeps the count itself. (Not for texts that an
    `augment` step changes before `batch`: their lengths are not stored.)

    tf.data cannot know how many batches length buckets make; each bucket
    yields its full batches and one remainder per epoch, whatever the order,
    so the count follows from how many texts fall in each bucket. The texts
    are counted once per process (a fast pass over the text feature only).
    """
    boundaries = options.bucket_boundaries
    if batch_size is None or not boundaries:
        return None
    key = (tuple((p, storage.stat(p)) for p in paths), tuple(boundaries), batch_size,
           options.max_length)
    if key not in _BATCH_COUNTS:
        spec = {"text": tf.io.FixedLenFeature([], tf.string)}
        lengths = tf.data.TFRecordDataset(list(paths)).batch(1024).map(
            lambda s: _words(_cut(tf.io.parse_example(s, spec)["text"], options)).row_lengths()
        )
        per_bucket = np.zeros(len(boundaries) + 1, np.int64)
        for values in lengths.as_numpy_iterator():
            # Bucket i holds boundaries[i - 1] <= length < boundaries[i].
            buckets = np.searchsorted(boundaries, values, side="right")
            per_bucket += np.bincount(buckets, minlength=len(per_bucket))
        _BATCH_COUNTS[key] = int(sum(-(-n // batch_size) for n in per_bucket.tolist()))
    return _BATCH_COUNTS[key]


def to_keras(inputs):
    if "labels" in inputs:
        return inputs["text"], inputs["labels"]
    return inputs["text"]


class Text(base.Problem):
    """The text problem's hooks: this module's functions."""

    NAME = NAME
    OPTIONS = ("bucket_boundaries", "max_length")
    batches_itself = True
    fixed_examples = False
    find_layout = staticmethod(find_layout)
    find_unlabelled_layout = staticmethod(find_unlabelled_layout)
    why_not = staticmethod(why_not)
    features = staticmethod(features)
    encode = staticmethod(encode)
    decode = staticmethod(decode)
    to_keras = staticmethod(to_keras)
    check_read_options = staticmethod(check_read_options)
    check_augmentation = staticmethod(check_augmentation)
    batch = staticmethod(batch)
    batch_count = staticmethod(batch_count)

    def batches_in_order(self, options):
        # Length buckets hand batches out as they fill.
        return not options.bucket_boundaries


PROBLEM = Text()
