"""What a `DatumDataset` reads: a source folder, exported to a cache on first
use, or a folder written by the original `datum` package, read in place.

Both give the front class the same few things: the metadata (exporting first
when needed), the folder the shards are in, the guard against a cache
exported over, the files left out, and the source file of each example. A
new kind of source is one more class with these methods, chosen in `open`.
"""

import json
import os

from keras_datum import cache
from keras_datum import datum_format
from keras_datum import export as export_lib
from keras_datum import metadata as metadata_lib
from keras_datum import problems
from keras_datum import shard_reader
from keras_datum import storage
from keras_datum import store as store_lib


def checked_path(source, cache_dir):
    """`source` as a str; refuses what is not a path."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"`source` must be a path to a folder. Received: source={source!r}")
    if cache_dir is not None and (
        not isinstance(cache_dir, (str, os.PathLike)) or not os.fspath(cache_dir)
    ):
        raise TypeError(
            "`cache_dir` must be a path to a folder (a str or os.PathLike, not "
            f"empty) or None. Received: cache_dir={cache_dir!r}"
        )
    return os.fspath(source)


def source_folder(source):
    """The absolute path of the source folder, which must exist."""
    if not storage.exists(source):
        raise FileNotFoundError(f"Source folder not found: {source!r}")
    if not storage.isdir(source):
        raise ValueError(f"`source` must be a folder. Received a file: {source!r}")
    return storage.abspath(source)


class FolderSource:
    """A source folder, validated and exported into a cache on first use.

    Attributes:
        path: the source folder.
        cache_dir: the cache the shards are read from: the dataset's own, or
            another cache of the folder that serves it (see `store.CacheStore`).
        exported: whether the last `metadata` call wrote an export.
    """

    in_place = False

    def __init__(self, path, cache_dir, config):
        self.path = path
        self._config = config
        export = config.export
        folder = store_lib.resolve_folder(path, cache_dir, export.carve_variant())
        self.store = store_lib.CacheStore(
            source=path,
            folder=folder,
            options=export,
            borrows=not cache_dir and not config.exact_cap,
            exact_cap=config.exact_cap,
        )
        self.cache_dir = folder
        self.exported = False

    def metadata(self, check, force=False, runner=None, beam_options=None):
        """The metadata of a cache that serves this dataset, exporting first
        when none does (see `DatumDataset.export`).

        Args:
            check: `check(problem, info)`, the caller's checks of what it will
                read, run on the layout found before any export.
        """
        self.exported = False
        # An export goes to this dataset's own folder, never over a cache of
        # the source that it only borrowed.
        self.cache_dir = self.store.folder
        store_lib.check_cache_target(self.cache_dir)
        runtime = self._config.runtime
        if runtime.reexport == "never" and not force:
            found = self.store.existing()
            if found is not None:
                self.cache_dir, meta = found
                return meta
        layout = self._layout()
        check(layout.problem, layout.info)
        sizes = {}
        fingerprint = cache.fingerprint(layout, self.path, sizes)
        fresh = not force and runtime.reexport == "auto"
        found = self.store.fresh(fingerprint) if fresh else None
        if found is not None:
            self.cache_dir, meta = found
            return meta
        with self.store.lock():
            # Another process may have exported while this one waited.
            found = self.store.fresh(fingerprint, [self.cache_dir]) if fresh else None
            if found is not None:
                return found[1]
            if runtime.verbose:
                print(layout.describe())
                print(f"Exporting to {self.cache_dir}")
            meta = export_lib.export_layout(
                layout, self.path, self.cache_dir, fingerprint=fingerprint,
                file_sizes=sizes, export_options=self._config.export,
                on_invalid=runtime.on_invalid, verbose=runtime.verbose,
                runner=runner, beam_options=beam_options,
            )
            self.exported = True
        return metadata_lib.Metadata.from_json(meta)

    def _layout(self):
        """The folder's layout, with the carve asked for checked against it."""
        export = self._config.export
        layout = problems.find_layout(
            self.path, export.problem, export.follow_links, unlabelled=export.unlabelled
        )
        if self._config.carve_asked and "val" in layout.splits:
            raise ValueError(
                f"{self.path!r} has its own validation split, so "
                "`validation_split` (which carves one out of train) would be "
                "ignored. Leave it out, or pass None. Received: validation_split="
                f"{export.validation_split!r}"
            )
        return layout

    def guard(self, meta):
        """The read path's check that the cache is still `meta`'s export."""
        return store_lib.guard_of(self.cache_dir, meta)

    def invalid_files(self):
        """The files the export left out, each with its split and reason."""
        with storage.open(os.path.join(self.cache_dir, cache.REPORT_FILE)) as f:
            return json.load(f)

    def file_paths(self, meta, split):
        """The source file of each example of `split`, in the export's order."""
        names = shard_reader.file_names(meta, self.cache_dir, split, self.guard(meta))
        return [os.path.join(self.path, name) for name in names]


class DatumExport:
    """A folder written by the original `datum` package, read in place:
    nothing is exported, validated or written (see `from_tfrecords`)."""

    in_place = True
    exported = False

    def __init__(self, path, config, class_names=None):
        self.path = path
        self.cache_dir = path
        self._config = config
        self.class_names = class_names

    def metadata(self, check, force=False, runner=None, beam_options=None):
        """The export's metadata, made from its JSON files (and, without
        class names, one scan of its labels)."""
        meta = datum_format.read_metadata(
            self.path, self._config.export.problem, self.class_names,
            verbose=self._config.runtime.verbose,
        )
        return metadata_lib.Metadata.from_json(meta)

    def guard(self, meta):
        return None  # Read in place, never exported over.

    def invalid_files(self):
        return []  # datum's shards are read as they are: nothing was left out.

    def file_paths(self, meta, split):
        raise ValueError("A datum export stores no file names, so it has no file paths.")


def open_source(path, cache_dir, config):
    """The source type of the folder `path`."""
    if datum_format.is_export(path):
        return DatumExport(path, config)
    return FolderSource(path, cache_dir, config)
