"""Image classification: class folders, split folders and Datum's CSV layout.

Source layouts, tried in this order:

1. Datum's CSV layout: a `<split>/` folder of images and a `<split>.csv` with a
   `filename` column (names without extension; with one is accepted too) and
   label columns.

   ```
   root/
     train/  0001.jpg 0002.png ...
     train.csv          filename,label
     val/    ...        0001,2
     val.csv
   ```

   One label column of integers (or of names) is a class label. One column of
   integer lists (`[0, 3]`) is multi-label: `y` is a multi-hot float32 vector.
   Floats, float lists or several numeric columns are regression targets:
   `y` is a float32 vector. No label column gives unlabelled images.
2. Split folders: `train/`, `val/` or `validation/`, and `test/`, each holding
   class folders.
3. One folder per class, exactly as `keras.utils.image_dataset_from_directory`
   reads it: classes are the sorted non-hidden subfolders, and images are
   found recursively below each.
"""

import csv
import io
import os

from keras_datum import images
from keras_datum import notices
from keras_datum import sources
from keras_datum import storage
from keras_datum.problems import base
from keras_datum.problems import labels
from keras_datum.sources import ExampleRecord
from keras_datum.sources import Layout

NAME = "classification"
SPLIT_FOLDERS = sources.SPLIT_NAMES


# --- Finding examples -------------------------------------------------------


def find_layout(root, follow_links=False):
    layout = _find_csv_layout(root, follow_links)
    if layout is not None:
        return layout
    return find_folder_layout(root, follow_links)


def find_unlabelled_layout(root, follow_links=False):
    """`label_mode=None`: a CSV layout as it is, else every image below `root`."""
    layout = _find_csv_layout(root, follow_links)
    if layout is not None:
        return layout
    return find_files_layout(root, follow_links)


def find_files_layout(root, follow_links, formats=sources.IMAGE_FORMATS, problem=NAME):
    """Every file of `formats` below `root`, without labels, as Keras reads a
    folder with `labels=None`: loose files and class folders alike, in one
    split, or in each of `train/`, `val/` and `test/` when those are all the
    folder holds. None when there is no such file."""
    subdirs = sources.visible_subdirs(root)
    if subdirs and "train" in subdirs and set(subdirs) <= set(SPLIT_FOLDERS):
        folders = {
            split: os.path.join(root, f)
            for split, f in sources.split_folders(subdirs, root).items()
        }
    else:
        folders = {"train": root}
    taken = set()
    splits = {
        split: [
            ExampleRecord(path=path, relpath=sources.relative_path(path, root))
            for path in sources.iter_image_files(folder, follow_links, formats, taken)
        ]
        for split, folder in folders.items()
    }
    if not splits["train"]:
        return None
    info = {"class_names": [], "label_spec": {"type": "none"}}
    return Layout(name="unlabelled_files", problem=problem, splits=splits, info=info)


def find_folder_layout(
    root, follow_links, formats=sources.IMAGE_FORMATS, problem=NAME, what="images"
):
    """Split folders of class folders, or class folders (shared with text)."""
    subdirs = sources.visible_subdirs(root)
    if subdirs and "train" in subdirs and set(subdirs) <= set(SPLIT_FOLDERS):
        name, class_root = "split_folders", os.path.join(root, "train")
        folders = {
            split: os.path.join(root, f)
            for split, f in sources.split_folders(subdirs, root).items()
        }
    else:
        if not storage.listdir(root):
            raise ValueError(f"The source folder {root!r} is empty.")
        _refuse_split_folders_with_others(root, subdirs)
        _refuse_split_folders_without_train(root, subdirs)
        name, class_root, folders = "class_folders", root, {"train": root}
    class_names = sources.visible_subdirs(class_root)
    if not class_names:
        raise ValueError(
            f"No class folders found in {class_root!r}: put the {what} of "
            "each class in a subfolder named after the class."
        )
    splits = {}
    # With links followed, a file two class or split folders reach (a loop
    # `a/b -> ../b`, `b/a -> ../a`) is listed once, under the first in sorted
    # order: else it would be two examples, perhaps one in train, one in val.
    taken = set()
    for split, folder in folders.items():
        extra = sorted(set(sources.visible_subdirs(folder)) - set(class_names))
        if extra:
            raise ValueError(
                f"{folder!r} has class folders that 'train/' lacks: {extra}."
            )
        splits[split] = _class_folder_records(
            folder, class_names, root, follow_links, formats, taken
        )
        _check_loose_files(folder, formats, what, bool(splits[split]))
    if not splits["train"]:
        raise ValueError(
            f"No {what} found in {class_root!r}. Expected files ending in one "
            f"of {', '.join(formats)} inside one folder per class."
        )
    return Layout(
        name=name, problem=problem, splits=splits, info=labels.class_info(class_names)
    )


def _refuse_split_folders_with_others(root, subdirs):
    """A `train/` beside another split folder holding the same class folders
    is a split-folders source with something else at its top: read as class
    folders, its classes would be the split names. (A class named `train`,
    as in Pascal VOC, holds images, not the other split's class folders.)"""
    splits = [f for f in subdirs if f in SPLIT_FOLDERS]
    if "train" not in splits or len(splits) < 2:
        return
    train_classes = set(sources.visible_subdirs(os.path.join(root, "train")))
    for folder in splits:
        if folder != "train" and train_classes & set(
            sources.visible_subdirs(os.path.join(root, folder))
        ):
            others = sorted(set(subdirs) - set(SPLIT_FOLDERS))
            raise ValueError(
                f"{root!r} looks like split folders ('train/' and "
                f"'{folder}/' hold the same class folders), but it also has "
                f"{others}. A split-folders source holds only 'train/', "
                "'val/' (or 'validation/') and 'test/': move the others out."
            )


def _refuse_split_folders_without_train(root, subdirs):
    """`val/` and `test/` of class folders, and no `train/`: read as class
    folders, the classes would be the split names."""
    if not subdirs or not set(subdirs) <= set(SPLIT_FOLDERS):
        return
    if all(sources.visible_subdirs(os.path.join(root, d)) for d in subdirs):
        raise ValueError(
            f"{root!r} holds only the split folders {subdirs}, each with "
            "subfolders: split folders need a 'train/' (its class folders name "
            "the classes). To use these folders as classes, hold the images "
            "directly in them."
        )


def _check_loose_files(folder, formats, what, has_records):
    """Files beside the class folders have no class: Keras skips them too.

    Raises when they are all the split has (a `val/` of loose images would
    be an empty split), else warns with how many are left out.
    """
    loose = [
        n for n in storage.listdir(folder)
        if not n.startswith(".") and n.lower().endswith(formats)
        and not storage.isdir(os.path.join(folder, n))
    ]
    if not loose:
        return
    message = (
        f"{folder!r} holds {len(loose)} {what} outside the class folders "
        f"(such as {min(loose)!r}); they have no class"
    )
    if not has_records:
        raise ValueError(f"{message}, and the folder has no other {what}. Move them "
                         "into one folder per class.")
    notices.warn(f"{message} and are left out.")


def _class_folder_records(directory, class_names, root, follow_links, formats, taken):
    records = []
    for index, name in enumerate(class_names):
        class_dir = os.path.join(directory, name)
        for path in sources.iter_image_files(class_dir, follow_links, formats, taken):
            records.append(
                ExampleRecord(
                    path=path,
                    relpath=sources.relative_path(path, root),
                    labels={"label": [index]},
                    stratum=index,
                )
            )
    return records


# --- Datum's CSV layout -----------------------------------------------------


def _find_csv_layout(root, follow_links):
    found = {}
    for folder, split in SPLIT_FOLDERS.items():
        csv_path = os.path.join(root, folder + ".csv")
        if storage.is_any_file(csv_path) and storage.isdir(os.path.join(root, folder)):
            if split in found:
                raise ValueError(
                    f"{root!r} has both 'val.csv' and 'validation.csv'; keep one."
                )
            found[split] = (folder, csv_path)
    if not found:
        return None
    for folder in SPLIT_FOLDERS:
        csv_path = os.path.join(root, folder + ".csv")
        if storage.is_any_file(csv_path) and not storage.isdir(os.path.join(root, folder)):
            raise ValueError(
                f"{csv_path!r} has no {folder + '/'!r} folder beside it: in the CSV "
                "layout each split's images are in the folder named after its CSV."
            )
    if "train" not in found:
        raise ValueError(
            f"{root!r} has CSV splits {sorted(found)} but no 'train.csv' "
            "with a 'train/' folder."
        )
    rows_by_split = {}
    columns = None
    for split, (folder, csv_path) in found.items():
        split_columns, rows = _read_csv(root, folder, csv_path, follow_links)
        if columns is not None and split_columns != columns:
            raise ValueError(
                f"{csv_path!r} has label columns {split_columns}, but the "
                f"other CSV files have {columns}."
            )
        columns = split_columns
        rows_by_split[split] = rows
    sources.refuse_files_in_two_splits(
        {split: [path for path, _, _ in rows] for split, rows in rows_by_split.items()},
        follow_links,
    )
    label_spec, class_names, encode = labels.infer_labels(columns, rows_by_split)
    splits = {}
    for split, rows in rows_by_split.items():
        splits[split] = []
        for path, cells, _where in rows:
            record_labels, stratum = encode(cells)
            splits[split].append(
                ExampleRecord(
                    path=path,
                    relpath=sources.relative_path(path, root),
                    labels=record_labels,
                    stratum=stratum,
                )
            )
    return Layout(
        name="csv",
        problem=NAME,
        splits=splits,
        info={"class_names": class_names, "label_spec": label_spec},
        extra_files=[csv_path for _, csv_path in found.values()],
    )


def _read_csv(root, folder, csv_path, follow_links):
    """Returns (label column names, [(image path, label cells, 'file:line')])."""
    image_dir = os.path.join(root, folder)
    by_stem = {}
    for path in sources.iter_image_files(image_dir, follow_links):
        rel = sources.relative_path(path, image_dir)
        by_stem.setdefault(os.path.splitext(rel)[0], []).append(path)
        by_stem.setdefault(rel, []).append(path)
    reader = csv.reader(io.StringIO(sources.read_text(csv_path), newline=""))
    header = next(reader, None)
    if not header or "filename" not in [h.strip() for h in header]:
        raise ValueError(
            f"{csv_path!r} needs a header row with a 'filename' column. "
            f"Received header: {header}"
        )
    header = [h.strip() for h in header]
    name_index = header.index("filename")
    label_columns = [h for i, h in enumerate(header) if i != name_index]
    rows, missing, listed = [], [], {}
    end = reader.line_num
    for row in reader:
        # A row's first line (a quoted cell may span lines).
        line, end = end + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        where = f"{csv_path}:{line}"
        if len(row) != len(header):
            raise ValueError(
                f"{where}: expected {len(header)} columns, found {len(row)}."
            )
        name = row[name_index].strip()
        sources.resolve_inside(image_dir, name, where)
        matches = by_stem.get(name.replace(os.sep, "/"))
        if not matches:
            missing.append(name)
            continue
        if len(matches) > 1:
            raise ValueError(
                f"{where}: {name!r} matches several files: "
                f"{[os.path.basename(m) for m in matches]}."
            )
        if matches[0] in listed:
            # Twice in one split, a carve could put one copy in val.
            raise ValueError(
                f"{where}: {name!r} is listed again (first at "
                f"{listed[matches[0]]}); list each image once."
            )
        listed[matches[0]] = where
        cells = [c for i, c in enumerate(row) if i != name_index]
        rows.append((matches[0], cells, where))
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise ValueError(
            f"{csv_path!r} names {len(missing)} files missing from "
            f"{image_dir!r}: {shown}{' ...' if len(missing) > 5 else ''}"
        )
    if not rows:
        raise ValueError(f"{csv_path!r} lists no images.")
    return label_columns, rows


# --- Export and reading -----------------------------------------------------


def features(info):
    """The stored feature spec: the image plus the label."""
    return {**images.IMAGE_FEATURES, **labels.label_features(info)}


def encode(record, options):
    """Validates one image; returns (features to store, stats)."""
    features, stats, _ = images.encode_features(record.path, options.max_image_side)
    features.update(record.labels)
    return features, stats


def decode(parsed, info, options, seed=None):
    """Builds the KerasCV dict for one parsed example (graph code)."""
    inputs = {"images": images.decode_and_resize(parsed, options, seed)}
    return labels.with_labels(inputs, parsed, info, options)


def to_keras(inputs):
    if "labels" in inputs:
        return inputs["images"], inputs["labels"]
    return inputs["images"]


class Classification(base.Problem):
    """The classification problem's hooks: this module's functions, and
    `labels.check_label_mode` to check the read options."""

    NAME = NAME
    OPTIONS = base.IMAGE_OPTIONS
    find_layout = staticmethod(find_layout)
    find_unlabelled_layout = staticmethod(find_unlabelled_layout)
    features = staticmethod(features)
    encode = staticmethod(encode)
    decode = staticmethod(decode)
    to_keras = staticmethod(to_keras)
    check_read_options = staticmethod(labels.check_label_mode)


PROBLEM = Classification()
