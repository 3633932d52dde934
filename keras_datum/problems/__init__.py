"""Problem types: each module owns its source layouts, label features and `(x, y)`.

A problem module provides:

- `NAME`: the problem name used in `DatumDataset(problem=...)` and metadata.
- `find_layout(root, follow_links)`: a `Layout`, or `None` when the folder is
  not of this problem type. Raises `ValueError` for a folder that is of this
  type but broken.
- `check_read_options(info, options)`: raises `ValueError` for read options
  that this dataset cannot honour (for example `label_mode="binary"` with
  three classes).
- `features(info)`: the JSON feature spec of everything it stores.
- `encode(record, options)`: `(features, stats)` for one `ExampleRecord`,
  read and validated (`options` are the export options); raises `encode.InvalidExampleError` for an unusable example.
  Runs in export worker threads.
- `decode(parsed, info, options)`: the KerasCV-style dict
  (`{"images": ..., "labels": ...}`) built from one parsed example.
- `to_keras(inputs)`: the `(x, y)` (or `x`) handed to Keras.
- optionally `check_augmentation(augmentation, options)`: raises `ValueError`
  for a step that cannot handle this problem's data (a layer that ignores
  masks, or one that blends them).
- optionally `check_split(split, split_info, options, augmentations)`: warns
  about what reading `split` as asked would lose (boxes past `max_boxes`).
- optionally `batch(dataset, batch_size, options)` (`batch_size` may be None),
  when plain `batch` does not fit its elements (ragged or padded boxes).
- optionally `after_batch_augment(inputs, options)`: a batch as the problem
  batches it again, after `batch_augment` (boxes padded back to `max_boxes`).

The shared machinery (export, cache, pipeline) calls only these.
"""

import os

from keras_datum import sources
from keras_datum.problems import classification
from keras_datum.problems import detection
from keras_datum.problems import segmentation
from keras_datum.problems import text

# Detection order matters: the distinctive layouts are tried first, and the
# class-folder layout, which accepts any folder of subfolders, last.
PROBLEMS = {
    detection.NAME: detection,
    segmentation.NAME: segmentation,
    text.NAME: text,
    classification.NAME: classification,
}
PROBLEM_NAMES = tuple(PROBLEMS)


def get(name):
    return PROBLEMS[name]


def find_layout(root, problem=None, follow_links=False):
    """Detects the problem type and layout of `root`.

    Raises:
        ValueError: when no problem type recognises the folder.
    """
    candidates = [PROBLEMS[problem]] if problem else list(PROBLEMS.values())
    with sources.collector_paused():
        for module in candidates:
            layout = module.find_layout(root, follow_links=follow_links)
            if layout is not None:
                _check_class_names(layout, root)
                _check_training_examples(layout, root)
                return layout
    raise ValueError(
        f"Could not recognise a {problem or 'known'} layout in {root!r}. "
        "See docs/layouts.md for the folder trees keras_datum reads."
    )


def _check_training_examples(layout, root):
    """A layout that lists no training example (an empty `train.json`, a
    COCO file without images) is named here, before any work."""
    if not layout.splits.get("train"):
        found = ", ".join(f"{len(records)} {split}" for split, records in layout.splits.items())
        raise ValueError(
            f"{root!r} lists no training examples (as a {layout.problem} source "
            f"in the {layout.name!r} layout{': ' + found if found else ''}). "
            "See docs/layouts.md for the folder trees keras_datum reads."
        )


def _check_class_names(layout, root):
    """Class names are written as UTF-8 (metadata, TFDS label files): a
    folder named in another encoding (`caf\\xe9` from an old zip) is named
    here instead of failing the export halfway."""
    for name in layout.info.get("class_names", []):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(name)
            raise ValueError(
                f"The class name {raw!r} in {root!r} is not valid UTF-8 (a folder "
                f"named in another encoding, perhaps {raw.decode('latin-1')!r}). "
                "Rename it."
            ) from None
