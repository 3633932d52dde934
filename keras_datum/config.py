"""The options of a dataset, as frozen objects, and every argument check.

`configure` turns `DatumDataset`'s flat keyword arguments into three
frozen objects before any disk work: `ExportOptions` (what an export holds,
recorded in its metadata), `ReadOptions` (how examples are decoded and
handed out) and `RuntimeOptions` (shuffling, caching, reporting, devices).
Nothing changes them afterwards: a read-time override (a split's label
mode, a problem's default) makes a new object with `dataclasses.replace`.
"""

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from keras_datum import crop
from keras_datum import distribute
from keras_datum import encode as encode_lib
from keras_datum import images
from keras_datum import problems
from keras_datum.problems import detection
from keras_datum.problems import labels

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
# `DatumDataset`'s keyword arguments and their defaults (its signature
# repeats them; a test holds the two together).
DEFAULTS: Mapping[str, Any] = {
    "image_size": (256, 256),
    "batch_size": 32,
    "label_mode": "int",
    "color_mode": "rgb",
    "interpolation": "bilinear",
    "crop_to_aspect_ratio": False,
    "pad_to_aspect_ratio": None,
    "validation_split": 0.2,
    "seed": None,
    "shuffle": True,
    "shuffle_buffer_size": None,
    "cache_dir": None,
    "problem": None,
    "on_invalid": "skip",
    "reexport": "auto",
    "follow_links": False,
    "bounding_box_format": "xyxy",
    "max_boxes": None,
    "bounding_box_class_key": "labels",
    "bucket_boundaries": None,
    "max_length": None,
    "max_image_side": "auto",
    "cache": "auto",
    "cache_budget": None,
    "strategy": "auto",
    "mixed_precision": "auto",
    "image_dtype": None,
    "verbose": True,
}
# What `from_tfrecords` takes: the options that concern reading.
DATUM_READ_OPTIONS = (
    "image_size", "batch_size", "label_mode", "color_mode", "interpolation",
    "crop_to_aspect_ratio", "pad_to_aspect_ratio", "seed", "shuffle",
    "shuffle_buffer_size", "problem", "bounding_box_format", "max_boxes",
    "bounding_box_class_key", "cache", "cache_budget", "strategy",
    "mixed_precision", "image_dtype", "verbose",
)
# The export options that change what an export holds: a dataset that sets
# one away from its default gets its own default cache folder. That includes
# the size cap, so that a sweep over image sizes never exports over the
# datasets it made before.
CARVE_OPTIONS = (
    "validation_split", "seed", "problem", "follow_links", "max_image_side", "unlabelled",
)


# --- Argument checks ("Received:" errors, as Keras's) -----------------------


def is_int(value):
    """An integer (NumPy's too, from a hyperparameter grid), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_choice(name, value, allowed):
    """Raises unless `value` is one of `allowed`, by type as well as value:
    `1 == True`, so `cache=1` would pass for True."""

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


def check_bool(name, value):
    # A string such as "no" would be true.
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")


def check_positive_or_none(name, value):
    if value is not None and not (is_int(value) and value > 0):
        raise ValueError(
            f"`{name}` must be a positive integer or None. Received: {name}={value!r}"
        )


def check_positive(name, value):
    if not (is_int(value) and value > 0):
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def check_image_size(image_size):
    """`(height, width)` as a tuple of ints; an int `n` is `(n, n)`, as in Keras."""
    if is_int(image_size) and image_size > 0:
        return (int(image_size), int(image_size))
    if (
        not isinstance(image_size, (tuple, list))
        or len(image_size) != 2
        or not all(is_int(v) and v > 0 for v in image_size)
    ):
        raise ValueError(
            "`image_size` must be a positive integer or a tuple of 2 positive "
            f"integers (height, width). Received: image_size={image_size!r}"
        )
    return tuple(int(v) for v in image_size)


def check_batch_size(batch_size):
    """A positive int, or None (unbatched)."""
    if batch_size is not None and not (is_int(batch_size) and batch_size > 0):
        raise ValueError(
            "`batch_size` must be a positive integer or None. "
            f"Received: batch_size={batch_size!r}"
        )
    return None if batch_size is None else int(batch_size)


def check_seed(seed):
    """A seed as an int, or None. numpy's generators (the carve) take no
    negative seed, and tf.data's shuffle takes an int64."""
    if seed is not None and not (is_int(seed) and 0 <= seed < 2**63):
        raise ValueError(
            "`seed` must be a non-negative integer below 2**63, or None. "
            f"Received: seed={seed!r}"
        )
    return None if seed is None else int(seed)


def _check_validation_split(validation_split):
    if validation_split is not None and (
        isinstance(validation_split, (bool, np.bool_))
        or not isinstance(validation_split, numbers.Real)
        or not 0 <= validation_split < 1
    ):
        raise ValueError(
            "`validation_split` must be a float in [0, 1) or None. "
            f"Received: validation_split={validation_split!r}"
        )


def _check_bucket_boundaries(bucket_boundaries):
    if bucket_boundaries is not None and (
        not isinstance(bucket_boundaries, (list, tuple))
        or not bucket_boundaries
        or not all(is_int(b) and b > 0 for b in bucket_boundaries)
        or list(bucket_boundaries) != sorted(set(bucket_boundaries))
    ):
        raise ValueError(
            "`bucket_boundaries` must be an increasing list of positive "
            f"integers or None. Received: bucket_boundaries={bucket_boundaries!r}"
        )


# --- The option objects ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What an export holds. Recorded as `export_options` in its metadata
    (see `to_json`): a cache made with other ones is exported again.

    Attributes:
        validation_split: the fraction of `train` carved into `val`.
        seed: the carve's and the write-time shuffle's seed.
        follow_links: whether symlinked folders are followed.
        problem: the problem asked for, or None (detected).
        max_image_side: the export-time size cap, or None.
        min_image_side: the shortest the shorter side is shrunk to.
        min_shards: shard files each split has at least (one per worker).
        validation: the version of the export's validation rules.
        unlabelled: `label_mode=None`: every file below the folder, without
            labels, as Keras reads it (see `Problem.find_unlabelled_layout`).
            Recorded only when true, so that the caches exported before it
            keep their key.
    """

    validation_split: float = 0.2
    seed: int = DEFAULT_SEED
    follow_links: bool = False
    problem: str | None = None
    max_image_side: int | None = None
    min_image_side: int | None = None
    min_shards: int = 1
    validation: int = encode_lib.VALIDATION_VERSION
    unlabelled: bool = False

    @classmethod
    def from_arguments(cls, image_size, validation_split, seed, follow_links, problem,
                       max_image_side, min_shards=1, unlabelled=False):
        """The export options of checked arguments."""
        if max_image_side == "auto":
            # Twice the target keeps enough detail for random crops and zooms
            # while a 12 MP photo shrinks to a few hundred kilobytes, once.
            max_image_side = AUTO_SIDE_FACTOR * max(image_size)
        max_image_side = None if max_image_side is None else int(max_image_side)
        return cls(
            validation_split=float(validation_split or 0.0),
            seed=DEFAULT_SEED if seed is None else int(seed),
            follow_links=bool(follow_links),
            problem=problem,
            max_image_side=max_image_side,
            # Recorded so that caches shrunk before the cap kept the shorter
            # side are exported again.
            min_image_side=encode_lib.min_short_side(max_image_side),
            min_shards=min_shards,
            unlabelled=bool(unlabelled),
        )

    def to_json(self):
        """The dict recorded in the metadata (the export key hashes it)."""
        data = dataclasses.asdict(self)
        if not self.unlabelled:
            del data["unlabelled"]
        return data

    def carve_variant(self):
        """The carve options away from their defaults: they name the default
        cache folder (see `store.default_cache_dir`)."""
        defaults = _default_export_options()
        return {
            name: getattr(self, name)
            for name in CARVE_OPTIONS
            if getattr(self, name) != getattr(defaults, name)
        }


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How examples are decoded and handed out (graph code reads these).

    Attributes:
        image_size: `(height, width)` images are resized to.
        label_mode: `"int"`, `"categorical"`, `"binary"` or None.
        color_mode: `"grayscale"`, `"rgb"` or `"rgba"`.
        interpolation: the `tf.image.resize` method.
        crop_to_aspect_ratio: centre-crop to the target aspect ratio.
        pad_to_aspect_ratio: pad to it; None until the problem's default
            is set (`Problem.read_defaults`).
        bounding_box_format: detection: the format of the boxes handed out.
        max_boxes: detection: boxes per image, or None (ragged).
        bounding_box_class_key: detection: `"classes"` or `"labels"`.
        bucket_boundaries: text: the bucketing's length boundaries.
        max_length: text: the bytes a text is cut to, or None.
        image_dtype: None (the policy's compute dtype) or `"uint8"`.
        stored_images: the split's image statistics from the export (see
            `images.stored_images`), set per split by the read path.
        random_resized_crop: the fused crop of `train(random_resized_crop=)`
            (a `crop.RandomResizedCrop`), set per split by the read path.
    """

    image_size: tuple[int, int] = (256, 256)
    label_mode: str | None = "int"
    color_mode: str = "rgb"
    interpolation: str = "bilinear"
    crop_to_aspect_ratio: bool = False
    pad_to_aspect_ratio: bool | None = None
    bounding_box_format: str = "xyxy"
    max_boxes: int | None = None
    bounding_box_class_key: str = "labels"
    bucket_boundaries: tuple[int, ...] = ()
    max_length: int | None = None
    image_dtype: str | None = None
    stored_images: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)
    random_resized_crop: crop.RandomResizedCrop | None = None


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """How a dataset runs: its reads' defaults, caching, reporting, devices.

    Attributes:
        batch_size: the per-replica batch size, or None.
        seed: the read shuffle's and the augmentation's seed, or None.
        shuffle: whether `train()` shuffles by default.
        shuffle_buffer_size: the read shuffle's buffer, or None (automatic).
        on_invalid: `"skip"` or `"raise"`, at export and at read time.
        reexport: `"auto"`, `"never"` or `"always"`.
        cache: the decoded cache: `"auto"`, True or False.
        cache_budget: bytes the automatic cache may use, or None.
        strategy: `"auto"` or a `tf.distribute.Strategy`.
        mixed_precision: the policy mode asked for.
        verbose: whether the export reports and shows progress.
    """

    batch_size: int | None = 32
    seed: int | None = None
    shuffle: bool = True
    shuffle_buffer_size: int | None = None
    on_invalid: str = "skip"
    reexport: str = "auto"
    cache: Any = "auto"
    cache_budget: int | None = None
    strategy: Any = "auto"
    mixed_precision: str = "auto"
    verbose: bool = True


@dataclasses.dataclass(frozen=True)
class Config:
    """A dataset's checked options.

    Attributes:
        export: the `ExportOptions`.
        read: the `ReadOptions`, before the problem's defaults.
        runtime: the `RuntimeOptions`.
        problem_options: the problem-specific options set away from their
            defaults, checked against the problem once it is known.
        carve_asked: whether a carve was asked for explicitly (refused for
            a source with its own validation split).
        exact_cap: whether `max_image_side` was passed (exported as asked)
            rather than `"auto"` (a cache with a larger cap serves).
    """

    export: ExportOptions
    read: ReadOptions
    runtime: RuntimeOptions
    problem_options: Mapping[str, Any]
    carve_asked: bool
    exact_cap: bool


def _default_export_options():
    return ExportOptions.from_arguments(
        DEFAULTS["image_size"], DEFAULTS["validation_split"], DEFAULTS["seed"],
        DEFAULTS["follow_links"], DEFAULTS["problem"], DEFAULTS["max_image_side"],
    )


def _lower(name):
    """Interpolation names in any case, as Keras takes them (`"BILINEAR"`)."""
    return name.lower() if isinstance(name, str) else name


def _check_read_arguments(a):
    """The checks of the reading arguments (`a`: all arguments), in the
    order of the signature, so that the first bad one is named."""
    check_choice("label_mode", a["label_mode"], labels.LABEL_MODES)
    check_choice("color_mode", a["color_mode"], tuple(images.CHANNELS))
    interpolation = a["interpolation"]
    if _lower(interpolation) not in INTERPOLATIONS:
        check_choice("interpolation", interpolation, INTERPOLATIONS)
    for name in ("crop_to_aspect_ratio", "shuffle", "follow_links", "verbose"):
        check_bool(name, a[name])
    if a["pad_to_aspect_ratio"] is not None:
        check_bool("pad_to_aspect_ratio", a["pad_to_aspect_ratio"])
    if a["crop_to_aspect_ratio"] and a["pad_to_aspect_ratio"]:
        raise ValueError(
            "Only one of `pad_to_aspect_ratio`, `crop_to_aspect_ratio` can "
            "be set to `True`."
        )


def _check_other_arguments(a):
    _check_validation_split(a["validation_split"])
    check_seed(a["seed"])
    check_positive_or_none("shuffle_buffer_size", a["shuffle_buffer_size"])
    check_choice("bounding_box_format", a["bounding_box_format"], detection.BOUNDING_BOX_FORMATS)
    check_positive_or_none("max_boxes", a["max_boxes"])
    check_choice("bounding_box_class_key", a["bounding_box_class_key"], detection.CLASS_KEYS)
    _check_bucket_boundaries(a["bucket_boundaries"])
    check_positive_or_none("max_length", a["max_length"])
    check_choice("problem", a["problem"], problems.PROBLEM_NAMES + (None,))
    check_choice("on_invalid", a["on_invalid"], ON_INVALID)
    check_choice("reexport", a["reexport"], REEXPORT_MODES)
    if a["max_image_side"] != "auto":
        check_positive_or_none("max_image_side", a["max_image_side"])
    cache, budget = a["cache"], a["cache_budget"]
    check_choice("cache", cache, ("auto", True, False))
    check_positive_or_none("cache_budget", budget)
    if budget is not None and not (isinstance(cache, str) and cache == "auto"):
        raise ValueError(
            "`cache_budget` sizes the automatic cache, so it applies only with "
            f"cache='auto'. Received: cache={cache!r}, cache_budget={budget!r}"
        )
    distribute.check_strategy(a["strategy"])
    check_choice("mixed_precision", a["mixed_precision"], distribute.MIXED_PRECISION_MODES)
    check_choice("image_dtype", a["image_dtype"], IMAGE_DTYPES)


def configure(**arguments):
    """Checks `DatumDataset`'s keyword arguments (all but `source` and
    `cache_dir`) and builds its `Config`. Touches no disk.

    Raises:
        ValueError: an argument has a bad value; the message names it.
    """
    a = {**DEFAULTS, **arguments}
    image_size = check_image_size(a["image_size"])
    batch_size = check_batch_size(a["batch_size"])
    _check_read_arguments(a)
    _check_other_arguments(a)
    strategy = a["strategy"]
    export = ExportOptions.from_arguments(
        image_size, a["validation_split"], a["seed"], a["follow_links"], a["problem"],
        a["max_image_side"],
        min_shards=1 if strategy == "auto" else distribute.num_workers(strategy),
        unlabelled=a["label_mode"] is None,
    )
    read = ReadOptions(
        image_size=image_size,
        label_mode=a["label_mode"],
        color_mode=a["color_mode"],
        interpolation=_lower(a["interpolation"]),
        crop_to_aspect_ratio=bool(a["crop_to_aspect_ratio"]),
        pad_to_aspect_ratio=a["pad_to_aspect_ratio"],
        bounding_box_format=a["bounding_box_format"],
        max_boxes=a["max_boxes"],
        bounding_box_class_key=a["bounding_box_class_key"],
        bucket_boundaries=tuple(a["bucket_boundaries"] or ()),
        max_length=None if a["max_length"] is None else int(a["max_length"]),
        image_dtype=a["image_dtype"],
    )
    runtime = RuntimeOptions(
        batch_size=batch_size, seed=check_seed(a["seed"]), shuffle=a["shuffle"],
        shuffle_buffer_size=a["shuffle_buffer_size"], on_invalid=a["on_invalid"],
        reexport=a["reexport"], cache=a["cache"], cache_budget=a["cache_budget"],
        strategy=strategy, mixed_precision=a["mixed_precision"], verbose=a["verbose"],
    )
    given = {**a, "image_size": image_size, "interpolation": _lower(a["interpolation"])}
    return Config(
        export=export,
        read=read,
        runtime=runtime,
        problem_options={
            name: given[name]
            for name in problems.PROBLEM_OPTIONS
            if given[name] != DEFAULTS[name]
        },
        # A carve asked for, which a source with its own val split would ignore.
        carve_asked=export.validation_split not in (0.0, DEFAULTS["validation_split"]),
        exact_cap=not (isinstance(a["max_image_side"], str) and a["max_image_side"] == "auto"),
    )


def check_datum_read_arguments(options, class_names):
    """`from_tfrecords`'s checks: reading options only, and class names.

    Raises:
        TypeError: an option that concerns the export.
        ValueError: `class_names` is not a list of distinct strings.
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


def _in_words(names):
    """('a', 'b', 'c') -> 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def read_options_for(config, problem_name):
    """`config.read` for a dataset of that problem: its problem-specific
    options checked (one set for another problem would do nothing), and the
    problem's defaults filled in.

    Raises:
        ValueError: an option of another problem type was set.
    """
    for name, value in config.problem_options.items():
        owners = problems.PROBLEM_OPTIONS[name]
        if problem_name not in owners:
            raise ValueError(
                f"`{name}` applies to {_in_words(owners)} datasets, and this "
                f"one is {problem_name}, so it would be ignored. Received: {name}={value!r}"
            )
    return problems.get(problem_name).read_defaults(config.read)
