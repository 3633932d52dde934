"""Walking a source folder: which files are images, and where they are.

Shared by every problem type. Nothing here reads pixels (that is `encode`)
or imports TensorFlow, so listing a big tree stays cheap.
"""

import contextlib
import gc
import json
import os
from dataclasses import dataclass
from dataclasses import field

from keras_datum import storage

CLASS_NAME_FILES = ("classes.names", "labels.txt", "classes.txt")
# Folder and file names of splits, and the split each one means.
SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}

# Every extension `keras.utils.image_dataset_from_directory` accepts, plus the
# formats TensorFlow cannot decode, which the export converts.
KERAS_IMAGE_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
CONVERTED_IMAGE_FORMATS = (".webp", ".tif", ".tiff")
IMAGE_FORMATS = KERAS_IMAGE_FORMATS + CONVERTED_IMAGE_FORMATS


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a layout is listed.

    Listing 20,000 files makes about 60,000 small objects (records and their
    labels), enough to set off several full collections, each of which walks
    every object of the process: hundreds of thousands once TensorFlow and
    Keras are imported. That made listing 5x slower (260 ms against 51 ms
    for 20,000 files). The records hold no reference cycles, so nothing is
    left for the collector to find.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class ExampleRecord:
    """One source example before export.

    Attributes:
        path: absolute path of the image file.
        relpath: path relative to the source root, with `/` separators. It is
            stored in the shard, named in reports, and keys the fingerprint.
        labels: feature name -> list of ints or floats, written as is.
        stratum: what the validation carve stratifies on (the class), or
            `None` when the labels have no classes.
        annotation: problem-specific data read from annotation files (boxes,
            a mask path, a text), used by the problem's `encode`.
    """

    path: str
    relpath: str
    labels: dict = field(default_factory=dict)
    stratum: object = None
    annotation: object = None


# What macOS's zip adds beside the data (AppleDouble `._` files): never a
# class, though Keras would count it as one.
ARCHIVE_JUNK = ("__MACOSX",)


def visible_subdirs(directory):
    """Sorted non-hidden subfolders, as Keras lists class folders (less
    `__MACOSX`, a macOS zip's leftovers)."""
    return [
        name
        for name in sorted(storage.listdir(directory))
        if not name.startswith(".")
        and name not in ARCHIVE_JUNK
        and storage.isdir(os.path.join(directory, name))
    ]


def split_folders(names, directory, split_of=SPLIT_NAMES.get):
    """{split: folder name} of the split folders among `names` (subfolders
    of `directory`): `train/`, `val/` or `validation/`, `test/` (or the
    split each name gives by `split_of`, None for none).

    Raises:
        ValueError: both `val/` and `validation/` are there.
    """
    folders = {}
    for name in names:
        split = split_of(name)
        if split is None:
            continue
        if split in folders:
            raise ValueError(
                f"{directory!r} has both '{folders[split]}/' and '{name}/' "
                "folders; keep one."
            )
        folders[split] = name
    return folders


def require_train(splits, root, what):
    """Raises a ValueError naming `what` to add when `splits` (names, or a
    dict keyed by them) has no `train` split."""
    if "train" not in splits:
        raise ValueError(
            f"{root!r} has the splits {sorted(splits)} but no 'train' split: add {what}."
        )


def iter_image_files(directory, follow_links=False, formats=IMAGE_FORMATS, taken=None):
    """Yields the paths of files ending in `formats` below `directory`, in Keras's order.

    Keras sorts the walk by folder, then the files in each folder. Hidden
    folders below a class folder (`.ipynb_checkpoints`) are skipped, and so
    are hidden files. A symlink loop cannot trap the walk: with
    `follow_links=True` each real folder is visited once, and each real
    file is yielded once, from the first path that reaches it.

    Args:
        taken: with `follow_links=True`, the real paths of the files listed
            so far, which are skipped; the files yielded are added. Share
            one set between the calls listing a source's class (or split)
            folders, in sorted order, and a file two of them reach (a link
            `a/b -> ../b`) is listed once, under the first. Defaults to
            `None`: a set for this call alone.
    """
    walk = _walk(directory, follow_links)
    taken = set() if taken is None else taken
    for root, real_root, files in sorted(walk, key=lambda item: item[0]):
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(formats):
                continue
            if follow_links:
                real = _real_file(real_root, name)
                if real in taken:
                    continue
                taken.add(real)
            yield os.path.join(root, name)


def _real_file(real_root, name):
    """The real path of `name` in a folder whose real path is `real_root`.
    Only the file itself can still be a link: one `lstat`, not one per
    folder of the path (`realpath` on each file took 250 ms to list 10,000
    files, this 36 ms)."""
    path = os.path.join(real_root, name)
    return storage.realpath(path) if os.path.islink(path) else path


def _walk(directory, follow_links):
    """[(folder, its real path, its files)], each real folder once (the
    first reached, subfolders in sorted order, so that which one is
    deterministic)."""
    seen = set()
    walk = []
    for root, dirs, files in storage.walk(directory, followlinks=follow_links):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        real = storage.realpath(root) if follow_links else root
        if follow_links:
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
        walk.append((root, real, files))
    return walk


def refuse_files_in_two_splits(paths_by_split, follow_links):
    """Raises when folders linked to each other put one file in two splits.

    For layouts whose files are named by an annotation (a CSV row, a label
    or mask of the same name): which split the file belongs to is the
    user's to say. Class folders keep the first instead (`iter_image_files`).

    Args:
        paths_by_split: {split: image paths}.
        follow_links: links are followed; without, nothing is checked.

    Raises:
        ValueError: names both paths and the real file.
    """
    if not follow_links:
        return
    first = {}
    for split, paths in paths_by_split.items():
        for path in paths:
            other_split, other = first.setdefault(storage.realpath(path), (split, path))
            if other_split != split:
                raise ValueError(
                    f"{other!r} ({other_split}) and {path!r} ({split}) are one file, "
                    f"{storage.realpath(path)!r}, reached through a symbolic link: "
                    "it would be in two splits. Remove the link, or keep the file "
                    "in one split."
                )


def read_lines(path):
    """A UTF-8 text file's lines, as a file reads them (`\n`, `\r\n`; not the
    other breaks `str.splitlines` knows), so that line numbers are the
    editor's."""
    return [line.removesuffix("\r") for line in read_text(path).split("\n")]


def read_text(path, encoding="utf-8-sig"):
    """A text file's whole text (a UTF-8 byte order mark, which Windows
    tools write, is dropped).

    Raises:
        ValueError: the file is not in `encoding` (say, Latin-1 from an old
            tool); names the file and the first bad byte.
    """
    with storage.open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {data[e.start]:#04x} at offset "
            f"{e.start}). Save it as UTF-8."
        ) from None


def read_json_object(path, expected):
    """Loads a JSON file that must hold an object.

    Raises:
        ValueError: malformed JSON, a number too long for Python to read,
            arrays or objects nested too deeply, a key repeated in one object
            (JSON readers keep only the last one: an example or a field would
            be lost without a word), or not an object (`expected` says what
            it should be); names the file.
    """
    text = read_text(path)
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON ({e}).") from None
    except _RepeatedKey as e:
        raise ValueError(
            f"{path}: the key {e.args[0]!r} is repeated in one object; JSON readers "
            "keep only the last one. Give each entry its own key."
        ) from None
    except ValueError as e:
        # Python refuses integers of more than `sys.get_int_max_str_digits()`
        # digits (4,300), which no label, id or size has.
        raise ValueError(
            f"{path}: a number in it is too long to read ({str(e).split(';')[0]})."
        ) from None
    except RecursionError:
        raise ValueError(
            f"{path}: its arrays or objects are nested too deeply to read."
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected {expected}.")
    return data


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs):
    data = dict(pairs)
    if len(data) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return data


def read_class_names(root):
    """Class names from `classes.names`, `labels.txt` or `classes.txt`, one a line.

    Returns:
        `(names, path)`, or `(None, None)` when there is no such file.
    """
    for name in CLASS_NAME_FILES:
        path = os.path.join(root, name)
        if storage.is_any_file(path):
            names = [line.strip() for line in read_lines(path) if line.strip()]
            if len(set(names)) != len(names):
                raise ValueError(f"{path!r} lists a class name twice.")
            return names, path
    return None, None


def voc_split_lists(root, task):
    """VOC's split lists: `ImageSets/<task>/<split>.txt`, else datum's
    `ImageSets/<split>.txt`, else `<split>.txt` beside the image folders.

    Returns:
        {split: path} (empty when there are none).

    Raises:
        ValueError: one folder holds two lists of one split (`val.txt` and
            `validation.txt`): which one is meant is not clear.
    """
    folders = (os.path.join(root, "ImageSets", task), os.path.join(root, "ImageSets"), root)
    for folder in folders:
        lists = {}
        for name, split in SPLIT_NAMES.items():
            path = os.path.join(folder, name + ".txt")
            if not storage.is_any_file(path):
                continue
            if split in lists:
                raise ValueError(
                    f"{lists[split]!r} and {path!r} both list the {split!r} split. "
                    "Keep one of them."
                )
            lists[split] = path
        if lists:
            return lists
    return {}


def read_split_lists(lists):
    """The example ids of each split list (`voc_split_lists`), in file order.

    Each line's first word is an id; blank lines are skipped.

    Returns:
        {split: [(id, "file:line"), ...]}.

    Raises:
        ValueError: an id is listed twice, in one list or in two (it would
            be trained on twice, or trained on and validated on); names both
            lines.
    """
    seen = {}
    ids = {}
    for split, path in lists.items():
        ids[split] = []
        for number, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                continue
            example_id, where = line.split()[0], f"{path}:{number}"
            if example_id in seen:
                raise ValueError(
                    f"{where} lists {example_id!r}, which {seen[example_id]} lists "
                    "already. An example must be listed once, in one split."
                )
            seen[example_id] = where
            ids[split].append((example_id, where))
    return ids


def unique_stems(paths, directory):
    """{stem: path} of image files, the stem relative to `directory`.

    Raises:
        ValueError: two images share a stem (`a.jpg` and `a.png`): the
            annotation or mask named by the stem would fit either one.
    """
    by_stem = {}
    for path in paths:
        stem = os.path.splitext(relative_path(path, directory))[0]
        if stem in by_stem:
            raise ValueError(
                f"{by_stem[stem]!r} and {path!r} share the name {stem!r}, so "
                "the mask or annotation of that name would fit either one. "
                "Rename or remove one of them."
            )
        by_stem[stem] = path
    return by_stem


def file_size(path):
    """The size of `path`, or 0 when it is missing (reported at export)."""
    try:
        return storage.getsize(path)
    except OSError:
        return 0


def relative_path(path, root):
    """`path` relative to `root`, with `/` separators (fast for paths below it)."""
    prefix = root.rstrip(os.sep) + os.sep
    if path.startswith(prefix):
        relative = path[len(prefix):]
    else:
        relative = os.path.relpath(path, root)
    return relative.replace(os.sep, "/")


def resolve_inside(root, name, what):
    """Joins a file name read from an annotation or CSV onto `root`.

    Raises:
        ValueError: when the name is absolute or escapes `root` (`../x`).
    """
    if not name or os.path.isabs(name) or "\x00" in name:
        raise ValueError(f"{what} names an invalid path: {name!r}")
    full = storage.normpath(os.path.join(root, name))
    if not storage.is_inside(full, root):
        raise ValueError(
            f"{what} names a path outside the dataset root {root!r}: {name!r}"
        )
    return full


@dataclass
class Layout:
    """What a problem module found in a source folder.

    Attributes:
        name: the layout's name, reported to the user (`"class_folders"`).
        problem: the problem name.
        splits: split name -> list of `ExampleRecord`, in source order.
        info: JSON-serialisable facts the reader needs (`class_names`,
            `label_spec`), stored in the metadata.
        extra_files: absolute paths of non-image files read (CSV,
            annotations): part of the source fingerprint.
    """

    name: str
    problem: str
    splits: dict
    info: dict
    extra_files: list = field(default_factory=list)

    def describe(self):
        counts = ", ".join(f"{s}: {len(r)}" for s, r in self.splits.items())
        classes = self.info.get("class_names") or []
        return (
            f"Found layout '{self.name}' ({self.problem}) with "
            f"{len(classes)} classes; files per split: {counts}."
        )
