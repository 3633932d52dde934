"""Where bytes live: every file access of keras_datum goes through here.

Paths with a scheme (`gs://`, `s3://` with tensorflow-io, `hdfs://`,
`ram://`) go through `tf.io.gfile`, so a source folder and a cache can live on
any file system TensorFlow knows; the TFRecord reading and writing is
TensorFlow's own and needs nothing more. Local paths use the `os` module
directly: `tf.io.gfile` gives the same answers for them, but slower per call
(a listing of 20,000 files is felt), and without `os.walk`'s control over
symbolic links or `os.replace`'s atomic rename, which the local export's
commit relies on.
"""

import builtins
import errno
import io
import os
import posixpath
import re
import shutil
import stat as stat_lib

import tensorflow as tf


def is_url(path):
    """True for a path on a TensorFlow file system (`scheme://...`)."""
    return "://" in os.fspath(path)


def join(path, *names):
    if is_url(path):
        return posixpath.join(path, *names)
    return os.path.join(path, *names)


def normpath(path):
    """`os.path.normpath`, keeping a URL's `scheme://`."""
    path = os.fspath(path)
    if is_url(path):
        scheme, rest = path.split("://", 1)
        if not rest:
            return path
        # `ram:///tmp/x` and `file:///data` keep their leading slash.
        normalized = posixpath.normpath(rest)
        if rest.startswith("/") and not normalized.startswith("/"):
            normalized = "/" + normalized
        return f"{scheme}://{normalized}"
    return os.path.normpath(path)


def is_inside(path, root):
    """Whether normalized `path` is `root` or below it."""
    path, root = normpath(path), normpath(root)
    if is_url(path):
        return path == root or path.startswith(root.rstrip("/") + "/")
    return os.path.commonpath([path, root]) == root


# The characters TensorFlow's glob (`tf.io.gfile.glob`, `matching_files`)
# reads as a pattern, as a regular expression with one group.
GLOB_SPECIAL = r"([*?\[\]\\])"


def glob_escape(path):
    """`path` as a glob pattern that matches only itself: a folder named
    `run[1]` or `a*b` would otherwise match nothing, or other files."""
    return re.sub(GLOB_SPECIAL, r"\\\1", path)


def abspath(path):
    """An absolute local path; a URL is already absolute."""
    path = os.fspath(path)
    if not is_url(path):
        return os.path.abspath(path)
    # Without trailing slashes, but a root stays one: `ram://` (not `ram:`),
    # `file:///` (not `file://`).
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{rest.rstrip('/') or rest[:1]}"


def exists(path):
    return tf.io.gfile.exists(path) if is_url(path) else os.path.exists(path)


def isdir(path):
    return tf.io.gfile.isdir(path) if is_url(path) else os.path.isdir(path)


def isfile(path):
    if is_url(path):
        return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)
    return os.path.isfile(path)


def is_any_file(path):
    """True when something other than a folder is at `path` (links followed):
    a regular file, or a FIFO, device or socket, which `isfile` calls
    missing. For a file that must be read when it is there: reading then
    refuses a non-regular one by name, where `isfile` would skip it."""
    if is_url(path):
        return isfile(path)
    try:
        return not stat_lib.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):  # Missing, a dangling link, a bad name.
        return False


def listdir(path):
    if is_url(path):
        if path.startswith("ram://"):
            # The in-memory file system lists (and answers `exists`) by
            # string prefix: a sibling `dataset/x` of `data` shows up in it
            # as `set`, and `datas/x` as `s`. Its glob matches whole names.
            pattern = glob_escape(path.rstrip("/")) + "/*"
            found = (m.rstrip("/").rsplit("/", 1)[-1] for m in tf.io.gfile.glob(pattern))
            return list(dict.fromkeys(found))
        # gfile marks subfolders of some file systems with a trailing '/'.
        return [name.rstrip("/") for name in tf.io.gfile.listdir(path)]
    return os.listdir(path)


def walk(top, followlinks=False):
    """`os.walk` (top-down, `dirs` editable in place)."""
    if not is_url(top):
        yield from os.walk(top, followlinks=followlinks)
        return
    dirs, files = [], []
    for name in listdir(top):
        (dirs if isdir(join(top, name)) else files).append(name)
    yield top, dirs, files
    for name in dirs:
        yield from walk(join(top, name))


def realpath(path):
    return path if is_url(path) else os.path.realpath(path)


def stat(path):
    """`(size in bytes, modification time in ns)`; `FileNotFoundError` if missing."""
    if is_url(path):
        try:
            info = tf.io.gfile.stat(path)
        except tf.errors.NotFoundError:
            raise FileNotFoundError(path) from None
        return info.length, info.mtime_nsec
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


def getsize(path):
    return stat(path)[0]


def open(path, mode="r", encoding=None, newline=None, buffering=-1):
    """`open`, or a `tf.io.gfile.GFile` for a URL (text or binary by `mode`;
    `buffering` is for local files).

    A file opened to read is read whole at once, by `read_bytes`, with its
    checks: only a regular file (or a link to one), and never past the size
    bound. TensorFlow's errors (GFile opens lazily) arrive here too, as the
    OSError types the callers expect.
    """
    if "r" in mode and "+" not in mode:
        data = read_bytes(path)
        if "b" in mode:
            return io.BytesIO(data)
        return io.StringIO(data.decode(encoding or "utf-8"), newline=newline)
    if is_url(path):
        return tf.io.gfile.GFile(path, mode)
    kwargs = {} if "b" in mode else {"encoding": encoding or "utf-8", "newline": newline}
    return builtins.open(path, mode, buffering=buffering, **kwargs)


# Source files are read whole into memory, by every export worker at once: a
# bound keeps a runaway file (a link to a growing log, a disk image misnamed
# .png) from taking the machine's memory. 512 MiB is above the largest common
# annotation file (COCO 2017's instances_train2017.json, 448 MiB) and any
# compressed image under Pillow's decompression-bomb limit; an uncompressed
# TIFF or BMP past it needs the variable raised. It is read at each call, so
# forked export workers and Beam workers see the value the user set.
MAX_FILE_BYTES_VARIABLE = "KERAS_DATUM_MAX_FILE_BYTES"
DEFAULT_MAX_FILE_BYTES = 512 * 2**20


class RefusedFileError(OSError):
    """A source file that keras_datum will not read: not a regular file (a
    FIFO, a device, a socket), or larger than the size bound. Its `strerror`
    says why and its `filename` names it."""

    def __str__(self):
        return f"{self.filename!r}: {self.strerror}"


def max_file_bytes():
    """The size bound on a file read: `$KERAS_DATUM_MAX_FILE_BYTES`, else 512 MiB.

    Raises:
        ValueError: the variable is set to something other than a positive
            whole number of bytes.
    """
    text = os.environ.get(MAX_FILE_BYTES_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_FILE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"`{MAX_FILE_BYTES_VARIABLE}` must be a positive whole number of bytes. "
            f"Received: {MAX_FILE_BYTES_VARIABLE}={text!r}"
        )
    return value


def _too_large(path, size, bound):
    return RefusedFileError(
        errno.EFBIG,
        f"{size} bytes, over the bound of {bound} bytes that keras_datum reads "
        f"from one file; set the environment variable {MAX_FILE_BYTES_VARIABLE} "
        "to a larger number of bytes to read it",
        path,
    )


# What `stat` calls each kind of file that is neither a folder nor regular.
_SPECIAL_KINDS = (
    (stat_lib.S_ISFIFO, "a FIFO"),
    (stat_lib.S_ISCHR, "a character device"),
    (stat_lib.S_ISBLK, "a block device"),
    (stat_lib.S_ISSOCK, "a socket"),
)


def _require_regular(mode, path):
    """Raises unless `mode` (a `st_mode`) is a regular file's: a folder as
    `open` does, anything else as a `RefusedFileError` naming its kind."""
    if stat_lib.S_ISREG(mode):
        return
    if stat_lib.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    kind = next((name for test, name in _SPECIAL_KINDS if test(mode)), "a special file")
    raise RefusedFileError(
        errno.EINVAL,
        f"not a regular file ({kind}); only regular files, or links to them, are read",
        path,
    )


# Opened without blocking: opening a FIFO to read waits for a writer, for
# ever when there is none. A regular file reads the same with the flag.
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_BINARY", 0)
)


def _open_regular(path):
    """A descriptor of the regular file at `path` (links followed) and its size.

    The kind is checked before the open, so that no device is ever opened (a
    tape rewinds, a terminal may become the controlling one), and again on
    the descriptor, in case the file was swapped in between.
    """
    _require_regular(os.stat(path).st_mode, path)
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        _require_regular(info.st_mode, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_bytes(path):
    """A whole file's bytes; `OSError`s as `open` raises them.

    Only a regular file (or a link to one) is read, and never more than
    `max_file_bytes()` of it.

    A local file is read with plain system calls rather than through a
    buffered file object: the export reads every source file this way, and
    for tiny images the file object's setup is a few percent of the work.

    Raises:
        RefusedFileError: `path` is a FIFO, a device or a socket, or holds
            more than the bound; the message names the file and the reason.
        FileNotFoundError, IsADirectoryError, PermissionError: as `open`.
    """
    bound = max_file_bytes()
    if is_url(path):
        return _read_url(path, bound)
    fd, size = _open_regular(path)
    try:
        if size > bound:
            raise _too_large(path, size, bound)
        # One read asks for a byte more than the file has: getting exactly
        # its size back is the end (no second read to see it), and a file
        # that grew or a short read is read on to its end, or to the bound.
        data = os.read(fd, size + 1)
        if len(data) == size:
            return data
        parts, total = [data], len(data)
        while total <= bound:
            chunk = os.read(fd, min(max(size, 1 << 16), bound + 1 - total))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            total += len(chunk)
        raise _too_large(path, f"more than {bound}", bound)
    finally:
        os.close(fd)


def _read_url(path, bound):
    """`read_bytes` on a TensorFlow file system: the size it states, at most
    the bound (a read of `n` bytes sets aside `n` bytes first)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            size = f.size()
            if size <= bound:
                return f.read(size)
    except tf.errors.NotFoundError:
        raise FileNotFoundError(f"No such file: {path!r}") from None
    except tf.errors.OpError as e:
        raise OSError(f"Cannot read {path!r}: {e.message}") from None
    raise _too_large(path, size, bound)


def write_text(path, text):
    """Writes UTF-8 `text`, on disk (fsync) before returning where it can."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        if not is_url(path):
            f.flush()
            os.fsync(f.fileno())


def makedirs(path, exist_ok=False):
    if is_url(path):
        if not exist_ok and tf.io.gfile.exists(path):
            raise FileExistsError(path)
        tf.io.gfile.makedirs(path)
    else:
        os.makedirs(path, exist_ok=exist_ok)


def remove(path):
    if is_url(path):
        tf.io.gfile.remove(path)
    else:
        os.remove(path)


def rmdir(path):
    if is_url(path):
        tf.io.gfile.rmtree(path)
    else:
        os.rmdir(path)


def rmtree(path):
    """Removes a folder and everything in it; no error when it is gone."""
    if is_url(path):
        try:
            tf.io.gfile.rmtree(path)
        except tf.errors.NotFoundError:
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


def rename(source, target):
    """Renames a file, replacing `target`."""
    if is_url(source):
        tf.io.gfile.rename(source, target, overwrite=True)
    else:
        os.replace(source, target)
