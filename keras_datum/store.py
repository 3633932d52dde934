"""The cache store: where an export lives and whether one serves.

It owns a cache's whole life: where it lives (`keras_home`,
`default_cache_dir`, `caches_of`, or the folder given, outside the source), which cache serves a dataset (its own, or
another carve's with a larger size cap: "borrowing"), whether it is fresh,
the lock around an export, the commit that puts a finished export in place,
the removal of what dead exports left, and the guard that stops a reader
whose cache was exported over (see `guard_of`). The file formats are
`cache.py`'s; the writer (`export.py`) calls `commit` and the read path
`export_key`, and neither is imported here.
"""

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import time
import uuid
from typing import TYPE_CHECKING

import tensorflow as tf

from keras_datum import cache
from keras_datum import metadata as metadata_lib
from keras_datum import storage

if TYPE_CHECKING:  # Annotations only: config imports the problems.
    from keras_datum import config


def keras_home():
    """`$KERAS_HOME`, else `~/.keras`, as Keras itself resolves it."""
    if "KERAS_HOME" in os.environ:
        return os.environ["KERAS_HOME"]
    return os.path.join(os.path.expanduser("~"), ".keras")


def default_cache_dir(source, variant=None):
    """`<keras home>/datum/<folder name>-<short hash of the absolute path>`.

    Args:
        variant: the export options that differ from their defaults and
            change what the export holds (the validation carve's
            `validation_split` and `seed`, `problem`, `follow_links`, the
            size cap `max_image_side`), as a dict. When given, a short hash
            of them ends the name, so that datasets of one folder with
            different carves each get their own cache instead of exporting
            over each other's shards.
    """
    source = storage.abspath(source)
    digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    name = os.path.basename(source.rstrip(os.sep)) or "root"
    if variant:
        options = json.dumps(variant, sort_keys=True, default=str)
        name += "-" + hashlib.sha256(options.encode()).hexdigest()[:6]
    return os.path.join(keras_home(), "datum", f"{name}-{digest}")


def caches_of(source):
    """The cache folders under the default location that `source` exported
    to, one per carve (see `default_cache_dir`), the default carve's first."""
    default = default_cache_dir(source)
    parent, base = os.path.split(default)
    name, digest = base.rsplit("-", 1)
    found = [default] if is_cache_folder(default) else []
    if storage.isdir(parent):
        pattern = re.compile(re.escape(name) + r"-[0-9a-f]{6}-" + re.escape(digest))
        found += [
            os.path.join(parent, entry)
            for entry in sorted(storage.listdir(parent))
            if pattern.fullmatch(entry) and is_cache_folder(os.path.join(parent, entry))
        ]
    return found


def is_cache_folder(path):
    """True when `path` is a keras_datum cache (safe to replace): its
    metadata.json is keras_datum's (a `schema_version` and `splits`), or, if
    it is not (damaged), sits beside the features.json an export writes. A
    user's folder that merely has a file named metadata.json is not one."""
    metadata = os.path.join(path, cache.METADATA_FILE)
    if not storage.isfile(metadata):
        return False
    try:
        with storage.open(metadata) as f:
            meta = json.load(f)
        if isinstance(meta, dict) and "schema_version" in meta and "splits" in meta:
            return True
    except (OSError, ValueError):
        pass
    # A damaged cache of ours, or someone's file.
    return storage.isfile(os.path.join(path, cache.FEATURES_FILE))


@contextlib.contextmanager
def export_lock(cache_dir, timeout):
    """Holds an OS lock on `<cache_dir>.lock` so only one process exports.

    A cache on a remote file system (`gs://`, `ram://`) gets no lock: object
    stores have no locks to take. Two exports of one remote cache at once
    are then each safe (metadata.json is written last, so neither can leave a
    cache that is trusted half-written), but they do the work twice.

    Raises:
        TimeoutError: when another process holds the lock for longer than
            `timeout` seconds; the message names that process.
    """
    if storage.is_url(cache_dir):
        yield
        return
    lock_path = cache_dir.rstrip(os.sep) + ".lock"
    storage.makedirs(os.path.dirname(lock_path) or ".", exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                    raise TimeoutError(
                        f"Waited {timeout:.0f}s for the export lock {lock_path!r}, "
                        f"held by {holder or 'an unknown process'}."
                    ) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # Closing releases the lock.


# How long a process waits for another one's export of the same cache.
LOCK_TIMEOUT_SECONDS = 3600
# In a remote cache folder while its files are replaced one by one.
COMMIT_MARKER = ".keras_datum_commit"
# Written into each folder an export makes beside the cache (its temporary
# folder, the old cache it replaces): the next export removes folders that
# hold it (see `remove_leftovers`), never a user's folder of a like name.
LEFTOVER_MARK = ".keras_datum_leftover"


# What an export writes into its folder besides the fixed files: the next
# export replaces them all.
_OWN_NAME = re.compile(r".+-\d{5,}-of-\d{5,}\.tfrecord|.+\.labels\.txt")
_OWN_FILES = (
    cache.METADATA_FILE, cache.REPORT_FILE, cache.FEATURES_FILE,
    cache.DATASET_INFO_FILE, COMMIT_MARKER,
)
# What file managers, notebooks and NFS write into a folder just by being
# near it: an export replaces them with the rest. Any other hidden file
# (`.git`, `.env`, notes) is the user's and stops a re-export.
_SYSTEM_FILES = (".DS_Store", ".ipynb_checkpoints", ".Trashes", ".Spotlight-V100",
                 ".fseventsd", ".directory")
_SYSTEM_PREFIXES = ("._", ".nfs")


def check_cache_target(cache_dir, replacing=False):
    """Refuses to replace a folder that is not a keras_datum cache, and,
    with `replacing` (an export is about to replace it), a cache that holds
    files keras_datum did not write (a model saved into it, say): the commit
    would delete them.

    Raises:
        ValueError: `cache_dir` holds files that keras_datum did not write.
    """
    if (
        storage.isdir(cache_dir)
        and storage.listdir(cache_dir)
        and not is_cache_folder(cache_dir)
        # What a remote commit that died midway leaves: its marker. (A local
        # commit is one rename; shards without metadata there, or remote ones
        # without the marker, were put there by someone else: left alone.)
        and not storage.isfile(storage.join(cache_dir, COMMIT_MARKER))
    ):
        raise ValueError(
            f"`cache_dir` {cache_dir!r} exists and is not a keras_datum cache "
            "(it has no metadata.json); refusing to overwrite it. Choose an "
            "empty or new folder."
        )
    if storage.exists(cache_dir) and not storage.isdir(cache_dir):
        raise ValueError(f"`cache_dir` {cache_dir!r} exists and is not a folder.")
    if replacing and storage.isdir(cache_dir):
        foreign = sorted(
            name for name in storage.listdir(cache_dir)
            if name not in _OWN_FILES and not _OWN_NAME.fullmatch(name)
            and name not in _SYSTEM_FILES and not name.startswith(_SYSTEM_PREFIXES)
        )
        if foreign:
            raise ValueError(
                f"The cache {cache_dir!r} holds files keras_datum did not write: "
                f"{foreign}. Exporting again replaces the folder, which would "
                "delete them: move them out first."
            )


def remove_leftovers(cache_dir):
    """Removes temporary folders of exports that died (call under the lock).

    Remote caches have no lock, so another export's temporary folder may be
    alive: they are left alone (and never trusted).
    """
    if storage.is_url(cache_dir):
        return
    parent = os.path.dirname(cache_dir.rstrip(os.sep)) or "."
    base = os.path.basename(cache_dir.rstrip(os.sep))
    if not storage.isdir(parent):
        return
    # Only folders this module made (`export_layout` and `_commit`): those
    # holding its mark, and temporary folders holding nothing but what an
    # export writes (one killed before its mark, or after it removed it, or
    # made by a version without marks). A user's `flowers.old-20240101`
    # beside a cache named `flowers` has the name, not the mark; an old
    # cache without the mark may be a user's copy of one, and stays.
    ours = re.compile(re.escape(base) + r"\.(tmp-\d+-|old-)[0-9a-f]{8}")
    for name in storage.listdir(parent):
        path = os.path.join(parent, name)
        if not ours.fullmatch(name) or not storage.isdir(path):
            continue
        if storage.isfile(os.path.join(path, LEFTOVER_MARK)) or (
            name.startswith(f"{base}.tmp-") and _holds_only_export_files(path)
        ):
            storage.rmtree(path)


def _holds_only_export_files(folder):
    return all(
        name in _OWN_FILES or _OWN_NAME.fullmatch(name) for name in storage.listdir(folder)
    )


def mark_leftover(folder):
    """Marks a folder beside the cache as this module's, to be removed by
    `remove_leftovers` if it is ever left behind."""
    storage.write_text(os.path.join(folder, LEFTOVER_MARK), "")


def commit(tmp_dir, cache_dir):
    """Moves the finished export into place, replacing an older cache."""
    if storage.is_url(cache_dir):
        _commit_file_by_file(tmp_dir, cache_dir)
        return
    old = None
    if storage.isdir(cache_dir):
        if is_cache_folder(cache_dir):
            old = f"{cache_dir.rstrip(os.sep)}.old-{uuid.uuid4().hex[:8]}"
            storage.rename(cache_dir, old)
            try:
                mark_leftover(old)
            except OSError:
                pass  # Left unmarked if the disk is full: kept, never deleted by mistake.
        else:
            storage.rmdir(cache_dir)  # Empty, as check_cache_target ensured.
    storage.rename(tmp_dir, cache_dir)
    if old:
        storage.rmtree(old)


def _commit_file_by_file(tmp_dir, cache_dir):
    """The commit on object stores, which cannot rename a folder at once.

    The old metadata goes first (from then on the old cache is not trusted),
    then the old files, then the new files, and the new metadata last: at no
    moment does a trusted metadata.json sit beside the wrong shards.
    """
    storage.makedirs(cache_dir, exist_ok=True)
    marker = storage.join(cache_dir, COMMIT_MARKER)
    # The marker says "a keras_datum commit is under way here": a folder
    # left without metadata by a commit that died may then be replaced.
    storage.write_text(marker, "")
    names = storage.listdir(cache_dir)
    if cache.METADATA_FILE in names:
        storage.remove(storage.join(cache_dir, cache.METADATA_FILE))
    for name in names:
        if name not in (cache.METADATA_FILE, COMMIT_MARKER):
            storage.remove(storage.join(cache_dir, name))
    new = storage.listdir(tmp_dir)
    for name in sorted(new, key=lambda n: n == cache.METADATA_FILE):
        storage.rename(storage.join(tmp_dir, name), storage.join(cache_dir, name))
    storage.remove(marker)
    storage.rmtree(tmp_dir)


# What differs between two exports of the same content: left out of the
# export's content key (see `export_key`).
VOLATILE_KEYS = ("created", "keras_datum_version")
_VOLATILE = r'"(' + "|".join(VOLATILE_KEYS) + r')"\s*:\s*"[^"]*"'


def same_export(metadata, other):
    """Whether two parsed `metadata.json` are of the same export content."""
    return {k: v for k, v in metadata.items() if k not in VOLATILE_KEYS} == {
        k: v for k, v in other.items() if k not in VOLATILE_KEYS
    }


def export_key(metadata_text):
    """A hash of a cache's `metadata.json` text less its time stamp: the
    same for two exports of the same content, other for another carve (or
    for the same file reformatted: only its text is at hand in the graph)."""
    text = tf.strings.regex_replace(metadata_text, _VOLATILE, "")
    return tf.strings.to_hash_bucket_fast(text, 2**62)


def stale_cache_message(cache_dir):
    return (
        f"The cache {cache_dir!r} was exported again (or removed) after this "
        "dataset read it, by another DatumDataset or process sharing it with "
        "other options or a changed source: its shards are no longer this "
        "dataset's split. Create the DatumDataset again, or give each dataset "
        "its own `cache_dir`."
    )


def check_outside_source(cache_dir, source):
    # A cache inside the source would be read as data (a class folder named
    # after it) by the next export, and one holding the source would be
    # replaced, source and all, by the next export. Below a hidden folder of
    # the source (`$KERAS_HOME` at `<source>/.keras`), nothing reads it.
    if storage.is_url(cache_dir) != storage.is_url(source):
        return
    if not storage.is_url(cache_dir):
        cache_dir, source = os.path.realpath(cache_dir), os.path.realpath(source)
    inside = (cache_dir + "/").startswith(source.rstrip("/") + "/")
    if inside:
        below = cache_dir[len(source.rstrip("/")):].strip("/").split("/")
        inside = not any(part.startswith(".") for part in below)
    holds = (source + "/").startswith(cache_dir.rstrip("/") + "/")
    if inside or holds:
        raise ValueError(
            f"`cache_dir` {cache_dir!r} must be outside the source folder "
            f"{source!r}, and must not contain it: the export replaces the "
            "cache folder, and reads everything in the source."
        )


def options_satisfied(cached, wanted):
    """Whether an export made with `cached` options serves `wanted`.

    All must match, except the size cap and the shard minimum: images capped
    at a larger side (or not capped) serve a smaller cap as well, and the
    shard minimum is checked against the shards the export has (see
    `Metadata.has_shards_for`), whatever it was exported for.
    """
    cached, wanted = dict(cached), dict(wanted)
    cached_side = cached.pop("max_image_side", None)
    wanted_side = wanted.pop("max_image_side", None)
    # It follows the cap; a cache from before it was recorded has none and
    # is not reused.
    if ("min_image_side" in cached) != ("min_image_side" in wanted):
        return False
    cached.pop("min_image_side", None)
    wanted.pop("min_image_side", None)
    side_ok = cached_side is None or (
        wanted_side is not None and cached_side >= wanted_side
    )
    cached.pop("min_shards", None)
    wanted.pop("min_shards", None)
    return side_ok and cached == wanted


def temporary_folder(cache_dir):
    """A new, marked folder beside `cache_dir` for an export to write into
    (removed by `remove_leftovers` if the export dies)."""
    tmp_dir = f"{cache_dir.rstrip(os.sep)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    storage.makedirs(tmp_dir)
    mark_leftover(tmp_dir)
    return tmp_dir


def guard_of(cache_dir, meta):
    """Refuses to read shards that an export made after `meta` was read:
    another dataset or process with other options (or a changed source)
    exported over them, so the split a reader knows (its counts, its carve)
    is no longer the one on disk. An export of the same content (a forced
    one, say) is fine.

    Returns:
        The read path's guard, `(metadata path, export key)`, with which it
        repeats the check as each shard file is opened (see
        `shard_reader._guarded`).

    Raises:
        RuntimeError: the cache was exported over, or removed.
    """
    path = os.path.join(cache_dir, cache.METADATA_FILE)
    try:
        with storage.open(path, "rb") as f:
            text = f.read()
        on_disk = json.loads(text.decode("utf-8"))
    except (FileNotFoundError, ValueError):  # Removed, or half written.
        on_disk = None
    # Compared as JSON (a metadata.json reformatted by hand, say with
    # another indent, holds the same export), then guarded by its text.
    mine = json.loads(cache.json_text(meta.json))
    if not isinstance(on_disk, dict) or not same_export(on_disk, mine):
        raise RuntimeError(stale_cache_message(cache_dir))
    return path, int(export_key(text))


def still_the_export(guard):
    """Whether the cache at `guard = (metadata path, export key)` (see
    `guard_of`) is still that export: `shard_reader.is_the_export` in
    Python, for code that runs outside the graph. Missing for a moment
    while another export commits (two renames): not checked then."""
    path, key = guard
    try:
        with storage.open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return True
    return int(export_key(tf.constant(text))) == key


def resolve_folder(source, cache_dir, variant):
    """The cache folder of `source`: `cache_dir` when given (a link resolved:
    the export replaces the folder by renames, and would rename the link
    itself), else the default one for the carve `variant` (see
    `default_cache_dir`). Checked to lie outside the source."""
    if cache_dir:
        folder = storage.abspath(os.fspath(cache_dir))
        if os.path.islink(folder):
            folder = os.path.realpath(folder)
    else:
        folder = default_cache_dir(source, variant)
    check_outside_source(folder, source)
    return folder


@dataclasses.dataclass(frozen=True)
class CacheStore:
    """The caches that may serve one dataset of a source folder.

    Attributes:
        source: the source folder.
        folder: where this dataset exports (its own cache).
        options: the dataset's `config.ExportOptions`.
        borrows: whether other caches of the source may serve it: true for
            a default folder and `max_image_side="auto"` (a cache with a
            larger size cap serves a smaller one).
        exact_cap: whether a cache must have exactly this size cap.
    """

    source: str
    folder: str
    options: "config.ExportOptions"
    borrows: bool
    exact_cap: bool

    def folders(self):
        """This dataset's cache folder, then the caches it may borrow."""
        if not self.borrows:
            return [self.folder]
        others = [c for c in caches_of(self.source) if c != self.folder]
        return [self.folder, *others]

    def read(self, folder) -> metadata_lib.Metadata | None:
        """The metadata of the cache in `folder`, or None when there is none.

        Raises:
            cache.CacheError: this dataset's own cache is damaged.
        """
        try:
            data = cache.read_metadata(folder)
        except cache.CacheError:
            if folder == self.folder:
                raise
            return None  # Another carve's damaged cache is its own business.
        return None if data is None else metadata_lib.Metadata.from_json(data)

    def existing(self):
        """`(folder, metadata)` of a cache that serves as it is, or None
        (`reexport="never"`: the source is not looked at)."""
        wanted = self.options.to_json()
        for folder in self.folders():
            meta = self.read(folder)
            if meta is not None and (
                folder == self.folder or options_satisfied(meta.export_options, wanted)
            ):
                return folder, meta
        return None

    def fresh(self, fingerprint, folders=None):
        """`(folder, metadata)` of a cache made from the source as it is now
        (`fingerprint`) with options that serve this dataset, or None."""
        wanted = self.options.to_json()
        for folder in self.folders() if folders is None else folders:
            meta = self.read(folder)
            if (
                meta is not None
                and meta.source_fingerprint.get("digest") == fingerprint["digest"]
                and options_satisfied(meta.export_options, wanted)
                and meta.has_shards_for(self.options.min_shards)
                and (
                    not self.exact_cap
                    or meta.export_options.get("max_image_side") == self.options.max_image_side
                )
            ):
                return folder, meta
        return None

    def lock(self):
        """The lock held while exporting to `folder` (other processes wait)."""
        return export_lock(self.folder, LOCK_TIMEOUT_SECONDS)
