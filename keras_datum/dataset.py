"""`DatumDataset`: checks arguments, exports on first use, hands out splits."""

import functools
import inspect
import json
import numbers
import os

import numpy as np
import tensorflow as tf

from keras_datum import augment as augment_lib
from keras_datum import cache as cache_lib
from keras_datum import datum_format
from keras_datum import distribute
from keras_datum import encode as encode_lib
from keras_datum import export as export_lib
from keras_datum import images
from keras_datum import memory
from keras_datum import notices
from keras_datum import pipeline
from keras_datum import problems
from keras_datum import storage
from keras_datum.problems import classification
from keras_datum.problems import detection

# Without a seed the carve and the write-time shuffle still have to be the
# same in every process, so an unseeded dataset uses this one.
DEFAULT_SEED = 1337
INTERPOLATIONS = (
    "bilinear",
    "nearest",
    "bicubic",
    "area",
    "lanczos3",
    "lanczos5",
    "gaussian",
    "mitchellcubic",
)
REEXPORT_MODES = ("auto", "never", "always")
# `max_image_side="auto"` caps the longer side at this many times the target.
AUTO_SIDE_FACTOR = 2
ON_INVALID = ("skip", "raise")
# `None`: the mixed-precision policy's compute dtype.
IMAGE_DTYPES = (None, "uint8")
# How long a process waits for another one's export of the same cache.
LOCK_TIMEOUT_SECONDS = 3600
# What `from_tfrecords` takes: the options that concern reading.
DATUM_READ_OPTIONS = (
    "image_size", "batch_size", "label_mode", "color_mode", "interpolation",
    "crop_to_aspect_ratio", "pad_to_aspect_ratio", "seed", "shuffle",
    "shuffle_buffer_size", "problem", "bounding_box_format", "max_boxes",
    "bounding_box_class_key", "cache", "cache_budget", "strategy",
    "mixed_precision", "image_dtype", "verbose",
)


def _choice(name, value, allowed):
    # By type as well as value: `1 == True`, so `cache=1` would pass for True.
    def same(option):
        if isinstance(option, bool):
            return isinstance(value, (bool, np.bool_)) and bool(value) == option
        return (
            not isinstance(value, (bool, np.bool_))
            and isinstance(value, type(option))
            and value == option
        )

    if not any(same(option) for option in allowed):
        shown = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"`{name}` must be one of {shown}. Received: {name}={value!r}")


def _is_int(value):
    # NumPy integers too (`np.int64` from a hyperparameter grid), never bools.
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_image_size(image_size):
    if (
        not isinstance(image_size, (tuple, list))
        or len(image_size) != 2
        or not all(_is_int(v) and v > 0 for v in image_size)
    ):
        raise ValueError(
            "`image_size` must be a tuple of 2 positive integers (height, "
            f"width). Received: image_size={image_size!r}"
        )
    return tuple(int(v) for v in image_size)


def _check_batch_size(batch_size):
    if batch_size is not None and not (_is_int(batch_size) and batch_size > 0):
        raise ValueError(
            "`batch_size` must be a positive integer or None. "
            f"Received: batch_size={batch_size!r}"
        )
    return None if batch_size is None else int(batch_size)


# Read options of one problem type, and the problems they apply to. Set away
# from their defaults on a dataset of another type, they would do nothing.
_IMAGE_PROBLEMS = tuple(
    name for name in problems.PROBLEM_NAMES if name != problems.text.NAME
)
_PROBLEM_OPTIONS = {
    "bucket_boundaries": (problems.text.NAME,),
    "max_boxes": (problems.detection.NAME,),
    "bounding_box_format": (problems.detection.NAME,),
    "bounding_box_class_key": (problems.detection.NAME,),
    **{
        name: _IMAGE_PROBLEMS
        for name in (
            "image_size", "color_mode", "interpolation", "crop_to_aspect_ratio",
            "pad_to_aspect_ratio", "max_image_side",
        )
    },
}


def _in_words(names):
    """('a', 'b', 'c') -> 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _check_split(meta, split):
    if split not in meta["splits"]:
        raise ValueError(
            f"This dataset has no {split!r} split. Its splits are {sorted(meta['splits'])}."
        )


def _check_bool(name, value):
    # A string such as "no" would be true.
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")


def _check_positive_or_none(name, value):
    if value is not None and not (_is_int(value) and value > 0):
        raise ValueError(
            f"`{name}` must be a positive integer or None. Received: {name}={value!r}"
        )


# The export options that change what an export holds: a dataset that sets
# one away from its default gets its own default cache folder. That includes
# the size cap, so that a sweep over image sizes never exports over the
# datasets it made before.
_CARVE_OPTIONS = ("validation_split", "seed", "problem", "follow_links", "max_image_side")
# The splits a source folder can have (a datum export may name others).
_SPLITS = ("train", "val", "test")


def _export_options(image_size, validation_split, seed, follow_links, problem,
                    max_image_side, min_shards):
    """The export options recorded in the cache, from checked arguments."""
    if max_image_side == "auto":
        # Twice the target keeps enough detail for random crops and zooms
        # while a 12 MP photo shrinks to a few hundred kilobytes, once.
        max_image_side = AUTO_SIDE_FACTOR * max(image_size)
    max_image_side = None if max_image_side is None else int(max_image_side)
    return {
        "validation_split": float(validation_split or 0.0),
        "seed": DEFAULT_SEED if seed is None else int(seed),
        "follow_links": bool(follow_links),
        "problem": problem,
        "max_image_side": max_image_side,
        # Recorded so that caches shrunk before the cap kept the shorter
        # side are exported again.
        "min_image_side": encode_lib.min_short_side(max_image_side),
        # One shard file per training worker at least, so that each reads
        # its own (see `_split`).
        "min_shards": min_shards,
        "validation": encode_lib.VALIDATION_VERSION,
    }


@functools.cache
def _defaults():
    """`DatumDataset`'s argument defaults, and its carve options at them."""
    params = inspect.signature(DatumDataset).parameters
    given = {name: p.default for name, p in params.items() if name != "source"}
    options = _export_options(
        **{name: given[name] for name in (
            "image_size", "validation_split", "seed", "follow_links", "problem",
            "max_image_side",
        )},
        min_shards=1,
    )
    return given, {name: options[name] for name in _CARVE_OPTIONS}


def _read_seed(seed):
    """The read's seed: the one given, else one drawn from TensorFlow's global
    seed when `keras.utils.set_random_seed` (or `tf.random.set_seed`) has set
    it, as TensorFlow's own random ops do, so that a run repeats as a whole;
    else `None` (a fresh stream, read in parallel in any order)."""
    if seed is not None:
        return seed
    global_seed, op_seed = tf.compat.v1.random.get_seed(None)
    return None if global_seed is None else int(op_seed)


def _check_cache_outside_source(cache_dir, source):
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


def _check_seed(seed):
    # numpy's generators (the carve) take no negative seed, and tf.data's
    # shuffle takes an int64.
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**63):
        raise ValueError(
            "`seed` must be a non-negative integer below 2**63, or None. "
            f"Received: seed={seed!r}"
        )


def _options_satisfied(cached, wanted):
    """Whether an export made with `cached` options serves `wanted`.

    All must match, except the size cap and the shard minimum: images capped
    at a larger side (or not capped) serve a smaller cap as well, and the
    shard minimum is checked against the shards the export has (see
    `_enough_shards`), whatever it was exported for.
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


def _enough_shards(meta, min_shards):
    """Whether every split has a shard with examples for each of `min_shards`
    workers (or one per example, when it has fewer)."""
    for info in meta["splits"].values():
        filled = sum(1 for s in info["shards"] if s["num_examples"] > 0)
        if filled < min(min_shards, info["num_examples"]):
            return False
    return True


class DatumDataset:
    """A folder of images as validated, cached TFRecords, ready for `model.fit`.

    Creating a `DatumDataset` only checks its arguments. The first call that
    needs data (`train()`, `val()`, `test()`, `info`, `class_names`,
    `export()`) finds the layout, validates every image once and writes
    sharded TFRecords plus JSON metadata to the cache. Later uses, in this
    process or any other, read the cache, and export again only when the
    source files or the export options change.

    Supported layouts (see `docs/layouts.md`):

    ```
    class folders        split folders          Datum CSV
    root/                root/                  root/
      cat/ a.jpg ...       train/cat/ ...         train/  0001.jpg ...
      dog/ b.png ...       val/cat/ ...           train.csv  (filename,label)
                           test/cat/ ...          val/ + val.csv (optional)
    ```

    Args:
        source: the source folder, or a folder written by the original
            `datum` package (`shard_info.json`), which is read in place as
            `from_tfrecords` reads it.
        image_size: `(height, width)` the images are resized to when read.
            Defaults to `(256, 256)`, as in Keras.
        batch_size: examples per batch, or `None` for unbatched elements.
            Defaults to `32`.
        label_mode: `"int"` (int32 class index), `"categorical"` (float32
            one-hot), `"binary"` (float32 of shape `(1,)`, two classes only)
            or `None` (images only), as in Keras. A source without labels (a
            CSV without label columns) yields images only with `"int"` too.
            Multi-label and regression CSV labels are float32 vectors.
            Defaults to `"int"`.
        color_mode: `"grayscale"`, `"rgb"` or `"rgba"`. Defaults to `"rgb"`.
        interpolation: the `tf.image.resize` method. Defaults to `"bilinear"`.
        crop_to_aspect_ratio: centre-crop to the target aspect ratio before
            resizing, as Keras does. Defaults to `False`.
        pad_to_aspect_ratio: pad to the target aspect ratio before resizing,
            as Keras does. Defaults to `None`: `True` for detection (boxes
            keep their shape), `False` otherwise (as in Keras).
        validation_split: fraction of `train` carved into `val` at export when
            the source has no validation split; `None` or `0` carves none.
            The carve is stratified by class and fixed by `seed`. Defaults to
            `0.2`.
        seed: seeds the carve, the write-time shuffle and the read shuffle
            (a non-negative integer).
            Defaults to `None`, which uses a fixed seed for the export (so
            every process agrees) and an unseeded read shuffle.
        shuffle: shuffle `train()` each epoch. Defaults to `True`.
        shuffle_buffer_size: examples in the read shuffle buffer (encoded
            ones, or decoded ones with the cache). Splits of small raw-pixel
            images, batched with nothing per example, shuffle blocks of
            examples and then permute each window of this many examples.
            Defaults to `None`: `min(2048, examples in the split)`.
        cache_dir: where the export lives, outside the source folder.
            Defaults to `$KERAS_HOME/datum/<folder>-<hash of its absolute
            path>` (`~/.keras` when `KERAS_HOME` is unset), with a hash of
            the carve's options (`validation_split`, `seed`, `problem`,
            `follow_links`) added when they are not the defaults, so that
            datasets with other carves never export over each other.
        problem: `"classification"`, `"detection"`, `"segmentation"`,
            `"text"`, or `None` to detect it from the layout. Defaults to `None`.
        on_invalid: `"skip"` leaves unreadable images out and reports them in
            `invalid_files.json` in the cache; `"raise"` stops the export at
            the first one. At read time (an image that fails to decode
            although the export checked it), `"skip"` drops it with a
            `RuntimeWarning` naming it and `"raise"` stops naming its shard,
            record and source file. Defaults to `"skip"`.
        reexport: `"auto"` exports again when the source or the export
            options changed, `"never"` uses an existing cache as it is,
            `"always"` exports on every first use. Defaults to `"auto"`.
        follow_links: follow symlinked folders, as in Keras. Defaults to `False`.
        bounding_box_format: detection only: the KerasCV format of the boxes
            handed out (`"xyxy"`, `"rel_xyxy"`, `"xywh"`, `"center_xywh"`,
            `"yxyx"`, ...). Defaults to `"xyxy"`.
        max_boxes: detection only: pad (with -1) or cut each image's boxes
            to this many, giving dense tensors; `None` gives ragged batches.
            Defaults to `None`.
        bounding_box_class_key: detection only: `"classes"` (KerasCV) or
            `"labels"` (Keras core box-aware layers). Defaults to `"classes"`.
        max_image_side: export-time size cap: images whose longer side is
            more than 25% over it are shrunk to it once, at export (JPEGs
            re-encoded at quality 95), instead of being decoded at full size
            in every epoch; the shorter side is never shrunk below half the
            cap. `"auto"` is `2 * max(image_size)`; `None` keeps the
            originals. A cap near `image_size` makes every decoding epoch
            cheaper, at the cost of detail for zooms and crops. Each cap gets
            its own default cache folder; for `"auto"`, a cache with a larger
            (or no) cap is reused, while a cap passed is exported as asked.
            Defaults to `"auto"`.
        cache: keep the decoded split in memory, at the target size as uint8,
            from the first epoch on, so that later epochs decode nothing.
            `"auto"` caches when the decoded split fits `cache_budget`;
            `True` always; `False` never. Defaults to `"auto"`. A cached
            split's seeded order and its pixels (rounded to uint8 after the
            resize, and clipped to [0, 255]: a bicubic or Lanczos resize
            overshoots) differ from an uncached one's, so `"auto"` on machines
            with other free memory can give other streams: pass `True` or
            `False` for one that repeats everywhere.
        cache_budget: with `cache="auto"` only (refused with another
            `cache`): bytes the automatic cache may use for one split; each
            split is checked on its own when it is built, so `train()` and
            `val()` may together use twice this. Defaults to `None`: a
            quarter of the memory available when the split is built (after
            the splits cached before it took theirs): the host's, or what a
            container's or job's memory limit (its cgroup's) leaves, where
            that is less.
        bucket_boundaries: text only: batch texts of similar length together
            (datum's `bucket_by_sequence_length`); lengths are counted in
            whitespace-separated words. Defaults to `None` (plain batches).
        strategy: `"auto"` (the strategy of an active `strategy.scope()`
            when a split is built; else MirroredStrategy over all GPUs when
            there are several, else the default strategy) or a
            `tf.distribute.Strategy`.
            `batch_size` is per replica. Defaults to `"auto"`.
        mixed_precision: `"auto"` (`mixed_float16` on GPUs of CUDA compute
            capability >= 7.0, `mixed_bfloat16` on TPU, unchanged on CPU; on
            Keras's JAX backend, as JAX sees the devices once it has started
            them: see `docs/distribution.md`),
            `"float32"` (leave the global policy alone), `"mixed_float16"` or
            `"mixed_bfloat16"`. Set when the dataset is created. Defaults to
            `"auto"`. See `docs/distribution.md`.
        image_dtype: the dtype images leave the pipeline in. `None` is the
            mixed-precision policy's compute dtype (float32 unless a mixed
            policy is set), as Keras's loaders give. `"uint8"` hands out the
            pixels rounded to integers in [0, 255] (after any augmentation,
            clipped to that range): a quarter of the bytes of float32 to copy
            to the accelerator and no cast on the CPU. The model casts them:
            a Functional or Sequential model to its `keras.Input`'s dtype, and
            `keras.layers.Rescaling` to its compute dtype; start a subclassed
            model with one of those. Not for text datasets. Defaults to
            `None`. See `docs/distribution.md`.
        verbose: print the layout found and show a progress bar. Defaults to
            `True`.

    Raises:
        FileNotFoundError: `source` does not exist.
        ValueError: an argument has a bad value; the message names it.
        TypeError: `source` or `cache_dir` is not a path.

    Example:

    ```python
    ds = DatumDataset("flowers/", image_size=(224, 224), batch_size=32)
    model.fit(ds.train(), validation_data=ds.val(), epochs=10)
    ```
    """

    def __init__(
        self,
        source,
        *,
        image_size=(256, 256),
        batch_size=32,
        label_mode="int",
        color_mode="rgb",
        interpolation="bilinear",
        crop_to_aspect_ratio=False,
        pad_to_aspect_ratio=None,
        validation_split=0.2,
        seed=None,
        shuffle=True,
        shuffle_buffer_size=None,
        cache_dir=None,
        problem=None,
        on_invalid="skip",
        reexport="auto",
        follow_links=False,
        bounding_box_format="xyxy",
        max_boxes=None,
        bounding_box_class_key="classes",
        bucket_boundaries=None,
        max_image_side="auto",
        cache="auto",
        cache_budget=None,
        strategy="auto",
        mixed_precision="auto",
        image_dtype=None,
        verbose=True,
    ):
        arguments = dict(locals())
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(
                f"`source` must be a path to a folder. Received: source={source!r}"
            )
        source = os.fspath(source)
        if cache_dir is not None and (
            not isinstance(cache_dir, (str, os.PathLike)) or not os.fspath(cache_dir)
        ):
            raise TypeError(
                "`cache_dir` must be a path to a folder (a str or os.PathLike, not "
                f"empty) or None. Received: cache_dir={cache_dir!r}"
            )
        self._image_size = _check_image_size(image_size)
        self._batch_size = _check_batch_size(batch_size)
        _choice("label_mode", label_mode, classification.LABEL_MODES)
        _choice("color_mode", color_mode, tuple(images.CHANNELS))
        _choice("interpolation", interpolation, INTERPOLATIONS)
        for name, value in (
            ("crop_to_aspect_ratio", crop_to_aspect_ratio), ("shuffle", shuffle),
            ("follow_links", follow_links), ("verbose", verbose),
        ):
            _check_bool(name, value)
        if pad_to_aspect_ratio is not None:
            _check_bool("pad_to_aspect_ratio", pad_to_aspect_ratio)
        if crop_to_aspect_ratio and pad_to_aspect_ratio:
            raise ValueError(
                "Only one of `pad_to_aspect_ratio`, `crop_to_aspect_ratio` can "
                "be set to `True`."
            )
        if validation_split is not None and (
            isinstance(validation_split, (bool, np.bool_))
            or not isinstance(validation_split, numbers.Real)
            or not 0 <= validation_split < 1
        ):
            raise ValueError(
                "`validation_split` must be a float in [0, 1) or None. "
                f"Received: validation_split={validation_split!r}"
            )
        _check_seed(seed)
        seed = None if seed is None else int(seed)
        _check_positive_or_none("shuffle_buffer_size", shuffle_buffer_size)
        _choice("bounding_box_format", bounding_box_format, detection.BOUNDING_BOX_FORMATS)
        _check_positive_or_none("max_boxes", max_boxes)
        _choice("bounding_box_class_key", bounding_box_class_key, detection.CLASS_KEYS)
        if bucket_boundaries is not None and (
            not isinstance(bucket_boundaries, (list, tuple))
            or not bucket_boundaries
            or not all(_is_int(b) and b > 0 for b in bucket_boundaries)
            or list(bucket_boundaries) != sorted(set(bucket_boundaries))
        ):
            raise ValueError(
                "`bucket_boundaries` must be an increasing list of positive "
                f"integers or None. Received: bucket_boundaries={bucket_boundaries!r}"
            )
        _choice("problem", problem, problems.PROBLEM_NAMES + (None,))
        _choice("on_invalid", on_invalid, ON_INVALID)
        _choice("reexport", reexport, REEXPORT_MODES)
        if max_image_side != "auto":
            _check_positive_or_none("max_image_side", max_image_side)
        _choice("cache", cache, ("auto", True, False))
        _check_positive_or_none("cache_budget", cache_budget)
        if cache_budget is not None and not (isinstance(cache, str) and cache == "auto"):
            raise ValueError(
                "`cache_budget` sizes the automatic cache, so it applies only with "
                f"cache='auto'. Received: cache={cache!r}, cache_budget={cache_budget!r}"
            )
        distribute.check_strategy(strategy)
        _choice("mixed_precision", mixed_precision, distribute.MIXED_PRECISION_MODES)
        _choice("image_dtype", image_dtype, IMAGE_DTYPES)
        if not storage.exists(source):
            raise FileNotFoundError(f"Source folder not found: {source!r}")
        if not storage.isdir(source):
            raise ValueError(f"`source` must be a folder. Received a file: {source!r}")

        self.source = storage.abspath(source)
        self._export_options = _export_options(
            self._image_size, validation_split, seed, follow_links, problem,
            max_image_side,
            min_shards=1 if strategy == "auto" else distribute.num_workers(strategy),
        )
        defaults, carve_defaults = _defaults()
        # A carve asked for, which a source with its own val split would ignore.
        self._carve_asked = self._export_options["validation_split"] not in (
            0.0, carve_defaults["validation_split"],
        )
        # Checked against the problem once it is known (`_resolve_read_options`).
        arguments["image_size"] = self._image_size
        self._problem_options_set = {
            name: arguments[name]
            for name in _PROBLEM_OPTIONS
            if arguments[name] != defaults[name]
        }
        self._default_cache_dir = not cache_dir
        # A cap passed (not the one `image_size` gives) is exported as asked:
        # a cache with a larger cap would decode more pixels every epoch.
        self._exact_cap = not (isinstance(max_image_side, str) and max_image_side == "auto")
        if cache_dir:
            self.cache_dir = storage.abspath(os.fspath(cache_dir))
            if os.path.islink(self.cache_dir):
                # The export replaces the folder by renames: a link would be
                # renamed itself, so the cache goes where it points.
                self.cache_dir = os.path.realpath(self.cache_dir)
        else:
            variant = {
                key: value
                for key, value in self._export_options.items()
                if key in carve_defaults and value != carve_defaults[key]
            }
            self.cache_dir = cache_lib.default_cache_dir(self.source, variant)
        # A datum export is read in place, like a cache: nothing is exported
        # and nothing is written (see `from_tfrecords`).
        self._datum_export = datum_format.is_export(self.source)
        self._datum_class_names = None
        if self._datum_export:
            self.cache_dir = self.source
        else:
            _check_cache_outside_source(self.cache_dir, self.source)
        # Where this dataset exports; `cache_dir` may instead name another
        # cache of the source that serves it (see `_caches_to_try`).
        self._own_cache_dir = self.cache_dir
        self._exported = False
        self._read_options = {
            "image_size": self._image_size,
            "label_mode": label_mode,
            "color_mode": color_mode,
            "interpolation": interpolation,
            "crop_to_aspect_ratio": bool(crop_to_aspect_ratio),
            # None: the problem's default (True for detection, else False).
            "pad_to_aspect_ratio": pad_to_aspect_ratio,
            "bounding_box_format": bounding_box_format,
            "max_boxes": max_boxes,
            "bounding_box_class_key": bounding_box_class_key,
            "bucket_boundaries": list(bucket_boundaries or []),
            # Checked by the problem with the others, before any export.
            "image_dtype": image_dtype,
        }
        self._seed = seed
        self._shuffle = shuffle
        self._shuffle_buffer_size = shuffle_buffer_size
        self._on_invalid = on_invalid
        self._reexport = reexport
        self._verbose = verbose
        self._meta = None
        # The splits built so far with the dataset's label mode.
        self._built_splits = set()
        self._cache = cache
        self._cache_budget = cache_budget
        self._strategy_arg = strategy
        self._strategy = None
        # Applied now, not at import or first read, so that a model built
        # after the dataset (inside `ds.strategy.scope()`) uses the policy.
        self.mixed_precision = distribute.apply_mixed_precision(mixed_precision)

    @classmethod
    def from_tfrecords(cls, path, *, class_names=None, **options):
        """Reads an export of the original `datum` package, in place.

        ```
        path/
          train-00000-of-00002.tfrecord ...
          val-00000-of-00001.tfrecord
          shard_info.json
          datum_to_type_and_shape_mapping.json
        ```

        datum's image classification exports (an `image` and numeric label
        columns) and VOC detection exports (`image`, `xmin`, `xmax`, `ymin`,
        `ymax`, `labels`) give the same `(x, y)` as a `DatumDataset` of the
        source folder. Nothing is exported, validated or written: the shards
        are read where they are. `DatumDataset(path)` notices a datum export
        and reads it the same way. See `docs/interop.md`.

        Args:
            path: the folder datum wrote.
            class_names: the class names in label order; for detection, the
                lines of datum's `classes.names` (datum's label 1 is class 0).
                Defaults to `None`: a `classes.names`, `labels.txt` or
                `classes.txt` in the folder, else the labels are read once
                (per process) and the classes named `"0"`, `"1"`, ...
                (`"1"`, `"2"`, ... after datum's labels for detection).
            **options: the reading options of `DatumDataset` (`image_size`,
                `batch_size`, `label_mode`, `color_mode`, `interpolation`,
                `crop_to_aspect_ratio`, `pad_to_aspect_ratio`, `seed`,
                `shuffle`, `shuffle_buffer_size`, `problem`,
                `bounding_box_format`, `max_boxes`, `bounding_box_class_key`,
                `cache`, `cache_budget`, `strategy`, `mixed_precision`,
                `image_dtype`, `verbose`), with the same defaults.

        Returns:
            A `DatumDataset` whose `train()`, `val()` and `test()` read the
            splits datum wrote.

        Raises:
            FileNotFoundError: `path`, one of its JSON files or a shard that
                `shard_info.json` lists is missing; the message names it.
            ValueError: a bad option or `class_names`, malformed JSON, or
                features that are neither layout above; names the file.
            TypeError: an export-only option (`validation_split`, `cache_dir`,
                ...), which does not apply to files read in place.

        Example:

        ```python
        ds = DatumDataset.from_tfrecords("voc_tfrecords/", problem="detection",
                                         bounding_box_format="xywh", max_boxes=32)
        model.fit(ds.train(), validation_data=ds.val(), epochs=10)
        ```
        """
        unknown = sorted(set(options) - set(DATUM_READ_OPTIONS))
        if unknown:
            raise TypeError(
                f"from_tfrecords() got options it does not take: {unknown}. A datum "
                "export is read as it is; it takes the reading options "
                f"{', '.join(DATUM_READ_OPTIONS)}."
            )
        if class_names is not None and (
            not isinstance(class_names, (list, tuple))
            or not all(isinstance(n, str) for n in class_names)
            or len(set(class_names)) != len(class_names)
        ):
            raise ValueError(
                "`class_names` must be a list of distinct strings or None. "
                f"Received: class_names={class_names!r}"
            )
        dataset = cls(path, **options)
        # The JSON files, the shards' presence and the feature layout are
        # checked now, before any shard is read.
        datum_format.check_export(dataset.source, options.get("problem"))
        dataset._datum_class_names = None if class_names is None else list(class_names)
        return dataset

    # --- Export and cache ---------------------------------------------------

    def export(self, force=False, *, runner=None, beam_options=None):
        """Exports now unless a valid, up-to-date cache exists.

        Args:
            force: export even when the cache is up to date.
            runner: `None` exports in this process (on every core); a Beam
                runner name (`"DirectRunner"`, `"DataflowRunner"`,
                `"FlinkRunner"`, `"SparkRunner"`) writes the shards with an
                Apache Beam pipeline instead (needs `keras-datum[beam]`). The
                cache is the same either way, and later uses reuse it.
            beam_options: the pipeline's options when `runner` is set: a
                `PipelineOptions`, a dict, or a list of command-line flags
                (`["--direct_num_workers=4"]`).

        Returns:
            The metadata dict (the same as `info`).
        """
        _check_bool("force", force)
        if runner is not None:
            from keras_datum import beam

            beam.pipeline_options(runner, beam_options)  # Checked before any work.
        elif beam_options is not None:
            raise ValueError("`beam_options` needs a `runner`. Received: runner=None")
        self._meta = None
        return self._ensure_exported(force=force, runner=runner, beam_options=beam_options)

    def _ensure_exported(self, force=False, runner=None, beam_options=None, check=None):
        if self._meta is not None:
            return self._meta
        if self._datum_export:
            return self._use(
                datum_format.read_metadata(
                    self.source,
                    self._export_options["problem"],
                    self._datum_class_names,
                    verbose=self._verbose,
                )
            )
        # Whether this call wrote an export (`benchmark` reports it).
        self._exported = False
        # An export goes to this dataset's own folder, never over a cache of
        # the source that it only borrowed (see `_caches_to_try`).
        self.cache_dir = self._own_cache_dir
        export_lib.check_cache_target(self.cache_dir)
        if self._reexport == "never" and not force:
            for folder in self._caches_to_try():
                meta = self._read_cache(folder)
                if meta is not None and (
                    folder == self._own_cache_dir
                    or _options_satisfied(meta["export_options"], self._export_options)
                ):
                    self.cache_dir = folder
                    return self._use(meta)
        layout = problems.find_layout(
            self.source,
            self._export_options["problem"],
            self._export_options["follow_links"],
        )
        # Read options are checked against what was found before any writing.
        if self._carve_asked and "val" in layout.splits:
            raise ValueError(
                f"{self.source!r} has its own validation split, so "
                "`validation_split` (which carves one out of train) would be "
                "ignored. Leave it out, or pass None. Received: validation_split="
                f"{self._export_options['validation_split']!r}"
            )
        self._resolve_read_options(layout.problem)
        problems.get(layout.problem).check_read_options(layout.info, self._read_options)
        if check is not None:
            check(layout.problem)  # The caller's checks of what it will read.
        sizes = {}
        fingerprint = cache_lib.fingerprint(layout, self.source, sizes)
        fresh = not force and self._reexport == "auto"
        if fresh:
            for folder in self._caches_to_try():
                meta = self._fresh_cache(fingerprint, folder)
                if meta is not None:
                    self.cache_dir = folder
                    return self._use(meta)
        with cache_lib.export_lock(self.cache_dir, LOCK_TIMEOUT_SECONDS):
            # Another process may have exported while this one waited.
            meta = self._fresh_cache(fingerprint) if fresh else None
            if meta is None:
                if self._verbose:
                    print(layout.describe())
                    print(f"Exporting to {self.cache_dir}")
                meta = export_lib.export_layout(
                    layout,
                    self.source,
                    self.cache_dir,
                    fingerprint=fingerprint,
                    file_sizes=sizes,
                    export_options=self._export_options,
                    on_invalid=self._on_invalid,
                    verbose=self._verbose,
                    runner=runner,
                    beam_options=beam_options,
                )
                self._exported = True
        return self._use(meta)

    def _caches_to_try(self):
        """This dataset's cache folder, then, for a default one, the other
        caches of the source: one exported with a larger size cap (for a
        larger `image_size`) serves this dataset too, without an export."""
        if not self._default_cache_dir or self._datum_export or self._exact_cap:
            return [self._own_cache_dir]
        others = [c for c in cache_lib.caches_of(self.source) if c != self._own_cache_dir]
        return [self._own_cache_dir, *others]

    def _read_cache(self, folder):
        """The metadata of the cache in `folder`, or None when there is none."""
        try:
            return cache_lib.read_metadata(folder)
        except cache_lib.CacheError:
            if folder == self._own_cache_dir:
                raise
            return None  # Another carve's damaged cache is its own business.

    def _fresh_cache(self, fingerprint, folder=None):
        meta = self._read_cache(folder or self.cache_dir)
        if (
            meta is not None
            and meta["source_fingerprint"].get("digest") == fingerprint["digest"]
            and _options_satisfied(meta["export_options"], self._export_options)
            and _enough_shards(meta, self._export_options["min_shards"])
            and (
                not self._exact_cap
                or meta["export_options"].get("max_image_side")
                == self._export_options["max_image_side"]
            )
        ):
            return meta
        return None

    def _resolve_read_options(self, problem):
        for name, value in self._problem_options_set.items():
            owners = _PROBLEM_OPTIONS[name]
            if problem not in owners:
                raise ValueError(
                    f"`{name}` applies to {_in_words(owners)} datasets, and this "
                    f"one is {problem}, so it would be ignored. Received: {name}={value!r}"
                )
        if self._read_options["pad_to_aspect_ratio"] is None:
            self._read_options["pad_to_aspect_ratio"] = problem == detection.NAME

    def _use(self, meta):
        self._resolve_read_options(meta["problem"])
        problems.get(meta["problem"]).check_read_options(meta, self._read_options)
        invalid = meta["invalid_files"]["count"]
        if invalid and self._on_invalid == "raise":
            report = os.path.join(self.cache_dir, cache_lib.REPORT_FILE)
            raise ValueError(
                f"The cached export left out {invalid} invalid files (see "
                f"{report}), and on_invalid='raise'. Fix or remove them."
            )
        self._meta = meta
        return meta

    def _check_cache_unchanged(self, meta):
        """Refuses to read shards that an export made after this dataset read
        its metadata: another dataset or process with other options (or a
        changed source) exported over them, so the split this dataset knows
        (its counts, its carve) is no longer the one on disk. An export of
        the same content (a forced one, say) is fine.

        Returns:
            The pipeline's guard, which repeats the check as each shard file
            is opened (see `pipeline._guarded`); `None` for a datum export,
            which is read in place and never exported over.
        """
        if self._datum_export:
            return None
        path = os.path.join(self.cache_dir, cache_lib.METADATA_FILE)
        try:
            with storage.open(path, "rb") as f:
                text = f.read()
            on_disk = json.loads(text.decode("utf-8"))
        except (FileNotFoundError, ValueError):  # Removed, or half written.
            on_disk = None
        # Compared as JSON (a metadata.json reformatted by hand, say with
        # another indent, holds the same export), then guarded by its text.
        mine = json.loads(cache_lib.json_text(meta))
        if not isinstance(on_disk, dict) or not pipeline.same_export(on_disk, mine):
            raise RuntimeError(pipeline.stale_cache_message(self.cache_dir))
        return path, int(pipeline.export_key(text))

    # --- What the export holds ---------------------------------------------

    @property
    def info(self):
        """The export's metadata: classes, counts, shards, options, fingerprint."""
        return self._ensure_exported()

    @property
    def class_names(self):
        """Class names, in label order (Keras's order for class folders)."""
        return list(self.info["class_names"])

    @property
    def num_examples(self):
        """Examples per split, for example `{"train": 2936, "val": 734}`."""
        return {s: v["num_examples"] for s, v in self.info["splits"].items()}

    @property
    def invalid_files(self):
        """The files left out at export, each with its split and reason."""
        if self._datum_export:
            return []  # datum's shards are read as they are: nothing was left out.
        self._ensure_exported()  # As `info`: the first use exports.
        with storage.open(os.path.join(self.cache_dir, cache_lib.REPORT_FILE)) as f:
            return json.load(f)

    # --- Reading ----------------------------------------------------------

    @property
    def strategy(self):
        """The `tf.distribute.Strategy` to build the model under.

        With `strategy="auto"` inside a `strategy.scope()`, that strategy,
        for as long as the scope lasts: it is not kept for later uses.
        """
        if self._strategy is not None:
            return self._strategy
        strategy = distribute.resolve_strategy(self._strategy_arg)
        if self._strategy_arg != "auto" or not distribute.in_strategy_scope():
            self._strategy = strategy
        return strategy

    @property
    def global_batch_size(self):
        """`batch_size` times the strategy's replicas in sync."""
        if self._batch_size is None:
            return None
        return self._batch_size * self.strategy.num_replicas_in_sync

    def _split(
        self,
        split,
        batch_size,
        shuffle,
        repeat,
        seed,
        augment=None,
        batch_augment=None,
        pre_batching_callback=None,
        post_batching_callback=None,
        data_service=None,
        preview=False,
    ):
        _check_seed(seed)
        seed = None if seed is None else int(seed)
        _check_bool("shuffle", shuffle)
        _check_bool("repeat", repeat)
        batch_size = self._batch_size if batch_size == "default" else batch_size
        _check_batch_size(batch_size)
        augmentations = augment_lib.resolve(
            augment, batch_augment, pre_batching_callback, post_batching_callback
        )
        if batch_size is None and augmentations[1] is not None:
            raise ValueError(
                "`batch_augment` (or `post_batching_callback`) works on batches, "
                "but `batch_size` is None: the examples are not batched. Pass a "
                "batch_size, or use `augment` for per-example layers."
            )
        if data_service is not None:
            self._check_data_service(data_service)

        def check_augmentations(problem_name):
            problem = problems.get(problem_name)
            for augmentation in augmentations:
                if augmentation is not None:
                    problem.check_augmentation(augmentation, self._read_options)

        # Before an export (once the layout is found), and for a cache read
        # as it is.
        meta = self._ensure_exported(check=check_augmentations)
        check_augmentations(meta["problem"])
        guard = self._check_cache_unchanged(meta)
        _check_split(meta, split)
        read_options = self._read_options_for(split, augmentations, meta, preview)
        problem = problems.get(meta["problem"])
        problem.check_split(split, meta["splits"][split], read_options, augmentations)
        strategy = self.strategy
        if batch_size is not None:
            batch_size *= strategy.num_replicas_in_sync
        paths = pipeline.shard_paths(meta, self.cache_dir, split)
        build = functools.partial(
            pipeline.build,
            meta,
            self.cache_dir,
            split,
            read_options,
            shuffle=shuffle,
            repeat=repeat,
            seed=_read_seed(self._seed if seed is None else seed),
            shuffle_buffer_size=self._shuffle_buffer_size,
            augment=augmentations[0],
            batch_augment=augmentations[1],
            image_dtype=self._read_options["image_dtype"] or distribute.input_dtype(),
            cache=self._cache_decoded(meta, split),
            data_service=data_service,
            guard=guard,
            on_invalid=self._on_invalid,
        )
        if distribute.num_workers(strategy) > 1:
            # Multi-worker training: each worker's input pipeline reads its
            # own shard files, at the per-replica batch size.
            def dataset_fn(context):
                return build(
                    batch_size=None
                    if batch_size is None
                    else context.get_per_replica_batch_size(batch_size),
                    shard_subset=(context.input_pipeline_id, context.num_input_pipelines),
                )

            dataset = strategy.distribute_datasets_from_function(dataset_fn)
        else:
            dataset = build(
                batch_size=batch_size,
                shard_policy=distribute.auto_shard_policy(strategy, len(paths)),
            )
        seeded = (self._seed if seed is None else seed) is not None
        for augmentation in augmentations:
            if augmentation is not None:
                # From the caller of train(); only about a seed it passed.
                augmentation.warn_pending(warn=seeded)
        return dataset

    def _check_data_service(self, data_service):
        if not isinstance(data_service, str) or not data_service:
            raise ValueError(
                "`data_service` must be a tf.data service dispatcher address "
                f"such as 'grpc://host:5050', or None. Received: data_service={data_service!r}"
            )
        if distribute.num_workers(self.strategy) > 1:
            # Each trainer worker would open its own job and read a whole
            # epoch, and FILE sharding cannot split a service's dataset.
            raise ValueError(
                "`data_service` cannot be combined with a multi-worker "
                "`strategy`: every worker would train on every example once per "
                "epoch. Use the multi-worker strategy alone (each worker reads "
                "its own shard files), or the data service with one trainer."
            )

    def _read_options_for(self, split, augmentations, meta, preview):
        """The read options for one split's pipeline.

        A layer that mixes labels (MixUp, CutMix) switches integer labels to
        one-hot for the whole dataset, so that `val()` built after it
        matches `train()` under one loss. A preview's switch is its own.
        Splits already built keep their integer labels: a warning names
        them (a hyperparameter search that tries MixUp after a plain trial
        builds its splits again; one that mixes old and new would fail in
        Keras on the label shapes, not silently).
        """
        label_mode = augment_lib.label_mode_for(
            augmentations, self._read_options["label_mode"], meta["label_spec"], preview
        )
        if label_mode == self._read_options["label_mode"]:
            if not preview:
                self._built_splits.add(split)
            return self._read_options
        if preview:
            return dict(self._read_options, label_mode=label_mode)
        if self._built_splits:
            built = ", ".join(f"{name}()" for name in sorted(self._built_splits))
            notices.warn(
                f"{built} of this dataset, built before, keep integer labels: "
                "build them again to match the one-hot labels from now on, or "
                "pass label_mode='categorical' to DatumDataset.",
            )
        self._read_options["label_mode"] = label_mode
        self._built_splits = {split}
        return self._read_options

    def _cache_decoded(self, meta, split):
        return self._cache_plan(meta, split)[0]

    def _cache_plan(self, meta, split):
        """`(cache, budget)`: whether `split` gets the decoded cache, and the
        budget its decoded size was judged against (`None` unless
        `cache="auto"`)."""
        if self._cache != "auto":
            return self._cache, None
        budget = self._cache_budget or memory.default_cache_budget()
        return pipeline.decoded_bytes(meta, split, self._read_options) <= budget, budget

    def train(
        self,
        *,
        batch_size="default",
        shuffle=None,
        repeat=False,
        seed=None,
        augment=None,
        batch_augment=None,
        pre_batching_callback=None,
        post_batching_callback=None,
        data_service=None,
    ):
        """The training split as a `tf.data.Dataset` of `(x, y)` batches.

        `x` is float32 in [0, 255] of shape `(batch, height, width, channels)`,
        as from `keras.utils.image_dataset_from_directory` (the compute dtype
        under a mixed-precision policy, uint8 with `image_dtype="uint8"`);
        `y` follows `label_mode`. The batch
        is the global batch: `batch_size` times the strategy's replicas.

        Args:
            batch_size: overrides the dataset's per-replica `batch_size`
                (`None` unbatches).
            shuffle: overrides the dataset's `shuffle`.
            repeat: repeat forever (pair with `steps_per_epoch`). Defaults to
                `False`: one pass per epoch.
            seed: overrides the dataset's `seed` for the read shuffle and the
                augmentation. With a seed the augmented stream repeats exactly.
                With neither, a seed is drawn from TensorFlow's global seed
                once `keras.utils.set_random_seed` has set it, so a run
                repeats as a whole (the per-example augmentation then runs
                on one thread, as with any seed); else every call gives a
                fresh stream, augmented in parallel.
            augment: a Keras/KerasCV layer, a callable, or a list of them,
                applied in order to each example before batching. Each gets
                and returns the dict `{"images": ..., "labels": ...}`.
            batch_augment: the same, applied to whole batches (MixUp, CutMix).
                Layers that mix labels switch `label_mode="int"` to
                `"categorical"` for the whole dataset, with a warning.
            pre_batching_callback: datum's name for `augment`.
            post_batching_callback: datum's name for `batch_augment`.
            data_service: a tf.data service dispatcher address
                (`"grpc://host:port"`): reading, decoding, augmentation and
                batching run on its workers, each shard file on one worker
                per epoch (DYNAMIC sharding: every example exactly once per
                epoch unless a worker dies). The decoded cache is off, and
                the last batch of each worker may be partial.

        Raises:
            TypeError: an augmentation is not a layer or callable.
            ValueError: an augmentation fails on the element, or returns
                something else than the element dict; the message names it.
            RuntimeError: the cache was exported again (by another dataset
                sharing its `cache_dir`) after this dataset read it.
        """
        shuffle = self._shuffle if shuffle is None else shuffle
        return self._split(
            "train", batch_size, shuffle, repeat, seed,
            augment, batch_augment, pre_batching_callback, post_batching_callback,
            data_service,
        )

    def val(self, *, batch_size="default", shuffle=False, repeat=False, seed=None,
            augment=None, batch_augment=None):
        """The validation split (not shuffled or augmented by default); see `train()`."""
        return self._split("val", batch_size, shuffle, repeat, seed, augment, batch_augment)

    def test(self, *, batch_size="default", shuffle=False, repeat=False, seed=None,
             augment=None, batch_augment=None):
        """The test split, when the source has one; see `train()`."""
        return self._split("test", batch_size, shuffle, repeat, seed, augment, batch_augment)

    def file_paths(self, split):
        """The source file of each example of `split`, in the order that
        `ds.<split>(shuffle=False)` yields them, as Keras's
        `dataset.file_paths`: to match predictions to files. (The order is
        the export's, in which the classes are interleaved: not Keras's.)
        An example from a JSON or CSV file is `<file>#<id>`.

        Raises:
            ValueError: no such split, or a datum export, which stores no
                file names.
        """
        meta = self._ensure_exported()
        _check_split(meta, split)
        if self._datum_export:
            raise ValueError(
                "A datum export stores no file names, so it has no file paths."
            )
        guard = self._check_cache_unchanged(meta)
        names = pipeline.file_names(meta, self.cache_dir, split, guard)
        return [os.path.join(self.source, name) for name in names]

    # --- Seeing the data ------------------------------------------------

    def preview(
        self,
        split="train",
        *,
        augment=None,
        batch_augment=None,
        num_images=16,
        columns=4,
        path=None,
        seed=None,
    ):
        """Draws a grid of samples after augmentation, captioned by class.

        Args:
            split: `"train"`, `"val"` or `"test"`. Defaults to `"train"`.
            augment: per-example augmentation to show (see `train()`).
            batch_augment: per-batch augmentation to show (MixUp shows the
                mixed classes with their weights).
            num_images: how many samples. Defaults to 16.
            columns: grid columns. Defaults to 4.
            path: when given, the figure is saved there (PNG by extension).
            seed: seeds the shuffle and augmentation of the samples.

        Returns:
            The `matplotlib.figure.Figure`; in a notebook it displays inline
            as the cell's last expression (or with `display(...)`).
        """
        from keras_datum import visualize

        for name, value in (("num_images", num_images), ("columns", columns)):
            if not (_is_int(value) and value > 0):
                raise ValueError(
                    f"`{name}` must be a positive integer. Received: {name}={value!r}"
                )
        # Everything that can be checked without the cache, before it is made.
        _check_seed(seed)
        augment_lib.resolve(augment, batch_augment, None, None)
        if not self._datum_export and split not in _SPLITS:
            raise ValueError(
                f"`split` must be one of {list(_SPLITS)}. Received: split={split!r}"
            )
        if path is not None:
            visualize.check_figure_path(path)
        if self.info["problem"] == problems.text.NAME:
            raise ValueError(
                "preview() draws images; for a text dataset look at "
                "`list(ds.train(batch_size=None).take(5))` instead."
            )
        batch = max(2, num_images) if batch_augment is not None else None
        dataset = self._split(
            split,
            batch,
            split == "train",
            False,
            seed,
            augment,
            batch_augment,
            preview=True,
        )
        if batch is not None:
            dataset = dataset.unbatch()
        figure = visualize.preview_figure(
            dataset,
            self.class_names,
            num_images=num_images,
            columns=columns,
            box_format=self._read_options["bounding_box_format"],
        )
        if path is not None:
            figure.savefig(path, dpi=80)
        return figure

    def summary(self, print_fn=print):
        """Prints (and returns) a dataset card: classes, counts, sizes, invalid files."""
        from keras_datum import visualize

        text = visualize.summary_text(self.info, self.invalid_files)
        if print_fn is not None:
            print_fn(text)
        return text

    def __repr__(self):
        return f"DatumDataset({self.source!r}, cache_dir={self.cache_dir!r})"
