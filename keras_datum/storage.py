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
import io
import os
import posixpath
import re
import shutil

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


def open(path, mode="r", encoding=None, newline=None, buffering=-1):  # noqa: A001
    """`open`, or a `tf.io.gfile.GFile` for a URL (text or binary by `mode`;
    `buffering` is for local files)."""
    if not is_url(path):
        kwargs = {} if "b" in mode else {"encoding": encoding or "utf-8", "newline": newline}
        return builtins.open(path, mode, buffering=buffering, **kwargs)
    if "r" not in mode:
        return tf.io.gfile.GFile(path, mode)
    # Read whole at once, so that TensorFlow's errors (GFile opens lazily)
    # arrive here, as the OSError types the callers expect.
    try:
        data = tf.io.gfile.GFile(path, "rb").read()
    except tf.errors.NotFoundError:
        raise FileNotFoundError(f"No such file: {path!r}") from None
    except tf.errors.OpError as e:
        raise OSError(f"Cannot read {path!r}: {e.message}") from None
    if "b" in mode:
        return io.BytesIO(data)
    return io.StringIO(data.decode(encoding or "utf-8"), newline=newline)


def read_bytes(path):
    """A whole file's bytes; `OSError`s as `open` raises them.

    A local file is read with plain system calls rather than through a
    buffered file object: the export reads every source file this way, and
    for tiny images the file object's setup is a few percent of the work.
    """
    if is_url(path):
        with open(path, "rb") as f:
            return f.read()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        size = os.fstat(fd).st_size
        # One read asks for a byte more than the file has: getting exactly
        # its size back is the end (no second read to see it), and a file
        # that grew or a short read is read on to its end.
        data = os.read(fd, size + 1)
        if len(data) == size:
            return data
        parts = [data]
        while chunk := os.read(fd, max(size, 1 << 16)):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


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
