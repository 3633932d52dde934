"""`DatumDataset`: the front class. It holds the checked options and delegates:
`config` checks the arguments, `source_types` finds or makes the metadata
(exporting through the cache store), `pipeline` builds each split."""

import dataclasses
import functools
import os

from keras_datum import augment as augment_lib
from keras_datum import cache
from keras_datum import config as config_lib
from keras_datum import crop
from keras_datum import datum_format
from keras_datum import distribute
from keras_datum import pipeline
from keras_datum import problems
from keras_datum import slicing
from keras_datum import source_types
from keras_datum import visualize


class DatumDataset(visualize.DatasetViews):
    """A folder of images as validated, cached TFRecords, ready for `model.fit`.

    Creating a `DatumDataset` only checks its arguments. The first call that
    needs data (`train()`, `val()`, `test()`, `info`, `class_names`,
    `export()`) finds the layout, validates every image once and writes
    sharded TFRecords plus JSON metadata to the cache. Later uses, in this
    process or any other, read the cache, and export again only when the
    source files or the export options change.

    Supported layouts: class folders (`root/cat/a.jpg`), split folders
    (`root/train/cat/a.jpg`, `root/val/...`), datum's CSV layout, Pascal
    VOC, COCO and YOLO detection, segmentation masks and text; see
    `docs/layouts.md`.

    Args:
        source: the source folder, or a folder written by the original
            `datum` package (`shard_info.json`), which is read in place as
            `from_tfrecords` reads it.
        image_size: `(height, width)` the images are resized to when read,
            or an int for a square size. Defaults to `(256, 256)`, as in Keras.
        batch_size: examples per batch, or `None` for unbatched elements.
            Defaults to `32`.
        label_mode: `"int"` (int32 class index), `"categorical"` (float32
            one-hot), `"binary"` (float32 of shape `(1,)`, two classes only)
            or `None` (images only: as Keras, every image below a folder of
            class folders or of images, loose ones too, with `class_names`
            None; a cache of its own). A source
            without labels (a CSV without label columns) yields images only
            with `"int"` too.
            Multi-label and regression CSV labels are float32 vectors.
            Defaults to `"int"`.
        color_mode: `"grayscale"`, `"rgb"` or `"rgba"`. Defaults to `"rgb"`.
        interpolation: the `tf.image.resize` method, in any case. Defaults
            to `"bilinear"`.
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
            every process agrees) and a read shuffle seeded afresh (drawn,
            and saved by `callbacks.BackupAndRestore` so a run resumes).
        shuffle: shuffle `train()` each epoch. Defaults to `True`.
        shuffle_buffer_size: examples in the read shuffle buffer, for the
            shuffled splits not read by index (see `train()`): those read
            by several workers or a tf.data service. Defaults to `None`:
            `min(2048, examples in the split)`.
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
        bounding_box_class_key: detection only: the key of the boxes'
            classes, `"labels"` (Keras core's box-aware layers and KerasHub's
            detectors) or `"classes"` (KerasCV's layers and models).
            Defaults to `"labels"`.
        max_image_side: export-time size cap: images whose longer side is
            more than 25% over it are shrunk to it once, at export, instead
            of being decoded at full size in every epoch (the shorter side
            never below half the cap). `"auto"` is `2 * max(image_size)`;
            `None` keeps the originals. Defaults to `"auto"`. See
            `docs/performance.md`.
        cache: keep the decoded split in memory, at the target size as uint8,
            from the first epoch on, so that later epochs decode nothing.
            `"auto"` caches when the decoded split fits `cache_budget`;
            `True` always; `False` never. A cached split's seeded order and
            pixels (rounded to uint8) differ from an uncached one's: pass
            `True` or `False` for a stream that repeats on every machine.
            Defaults to `"auto"`. See `docs/performance.md`.
        cache_budget: with `cache="auto"` only: bytes the automatic cache
            may use for one split. Defaults to `None`: a quarter of the
            memory available (the host's, or its cgroup limit's) when the
            split is built.
        max_length: text only: cut each text to this many bytes (UTF-8), as
            Keras's `text_dataset_from_directory` does. Defaults to `None`.
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
            pixels rounded to [0, 255]: a quarter of the bytes of float32 to
            copy, cast by the model's `keras.Input` or `Rescaling`. Not for
            text datasets. Defaults to `None`. See `docs/distribution.md`.
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
        bounding_box_class_key="labels",
        bucket_boundaries=None,
        max_length=None,
        max_image_side="auto",
        cache="auto",
        cache_budget=None,
        strategy="auto",
        mixed_precision="auto",
        image_dtype=None,
        verbose=True,
    ):
        arguments = dict(locals())
        del arguments["self"], arguments["source"], arguments["cache_dir"]
        source = source_types.checked_path(source, cache_dir)
        self._config = config_lib.configure(**arguments)
        self.source = source_types.source_folder(source)
        self._source = source_types.open_source(self.source, cache_dir, self._config)
        # The read options in force: the problem's defaults once it is known,
        # and the label mode a label-mixing layer switched to.
        self._read = self._config.read
        self._meta = None
        # The splits built so far with the dataset's label mode.
        self._built_splits = set()
        self._strategy = None
        distribute.keep_tensorflow_off_gpus()
        # Applied now, not at import or first read, so that a model built
        # after the dataset (inside `ds.strategy.scope()`) uses the policy.
        self.mixed_precision = distribute.apply_mixed_precision(
            self._config.runtime.mixed_precision
        )

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
            **options: the reading options of `DatumDataset`
                (`config.DATUM_READ_OPTIONS`: the image, label, box, shuffle,
                cache, device and dtype options), with the same defaults.

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
        config_lib.check_datum_read_arguments(options, class_names)
        dataset = cls(path, **options)
        # The JSON files, the shards' presence and the feature layout are
        # checked now, before any shard is read.
        datum_format.check_export(dataset.source, options.get("problem"))
        dataset._source.class_names = None if class_names is None else list(class_names)
        return dataset

    # --- Options and the export ---------------------------------------------

    @property
    def config(self):
        """The dataset's checked options: a frozen `config.Config` holding
        its `export`, `read` and `runtime` options."""
        return self._config

    @property
    def read_options(self):
        """The `config.ReadOptions` in force: the problem's defaults filled
        in once it is known, and the label mode a label-mixing layer set."""
        return self._read

    @property
    def cache_dir(self):
        """The folder the shards are read from: the dataset's cache, another
        cache of the source that serves it, or a datum export itself."""
        return self._source.cache_dir

    @property
    def exported(self):
        """Whether the last look at the cache wrote an export."""
        return self._source.exported

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
        config_lib.check_bool("force", force)
        if runner is not None:
            from keras_datum import beam

            beam.pipeline_options(runner, beam_options)  # Checked before any work.
        elif beam_options is not None:
            raise ValueError("`beam_options` needs a `runner`. Received: runner=None")
        self._meta = None
        return self._metadata(force=force, runner=runner, beam_options=beam_options).to_json()

    def _metadata(self, force=False, runner=None, beam_options=None, check=None):
        """The `Metadata` this dataset reads, exported first when needed.
        `check(problem)`: the caller's checks, run before any export."""
        if self._meta is not None:
            return self._meta

        def check_layout(problem, info):
            self._use_problem(problem, info)
            if check is not None:
                check(problem)

        meta = self._source.metadata(
            check_layout, force=force, runner=runner, beam_options=beam_options
        )
        self._use_problem(meta.problem, meta.json)
        if meta.invalid_count and self._config.runtime.on_invalid == "raise":
            report = os.path.join(self.cache_dir, cache.REPORT_FILE)
            raise ValueError(
                f"The cached export left out {meta.invalid_count} invalid files (see "
                f"{report}), and on_invalid='raise'. Fix or remove them."
            )
        self._meta = meta
        return meta

    def _use_problem(self, problem, info):
        """Fills in the problem's read defaults and checks the read options
        against what the data holds (`info`: the layout's or the metadata's)."""
        resolved = config_lib.read_options_for(self._config, problem)
        self._read = dataclasses.replace(resolved, label_mode=self._read.label_mode)
        problems.get(problem).check_read_options(info, self._read)

    # --- What the export holds ---------------------------------------------

    @property
    def info(self):
        """The export's metadata: classes, counts, shards, options, fingerprint."""
        return self._metadata().to_json()

    @property
    def class_names(self):
        """Class names, in label order (Keras's order for class folders);
        `None` with `label_mode=None` on unlabelled files, as in Keras."""
        meta = self._metadata()
        if self._read.label_mode is None and meta.label_spec.get("type") == "none":
            return None
        return list(meta.class_names)

    @property
    def num_examples(self):
        """Examples per split, for example `{"train": 2936, "val": 734}`."""
        return self._metadata().num_examples

    @property
    def invalid_files(self):
        """The files left out at export, each with its split and reason."""
        if not self._source.in_place:
            self._metadata()  # As `info`: the first use exports.
        return self._source.invalid_files()

    # --- Reading ----------------------------------------------------------

    @property
    def strategy(self):
        """The `tf.distribute.Strategy` to build the model under.

        With `strategy="auto"` inside a `strategy.scope()`, that strategy,
        for as long as the scope lasts: it is not kept for later uses.
        """
        if self._strategy is not None:
            return self._strategy
        asked = self._config.runtime.strategy
        strategy = distribute.resolve_strategy(asked)
        if asked != "auto" or not distribute.in_strategy_scope():
            self._strategy = strategy
        return strategy

    @property
    def global_batch_size(self):
        """`batch_size` times the strategy's replicas in sync."""
        batch_size = self._config.runtime.batch_size
        if batch_size is None:
            return None
        return batch_size * self.strategy.num_replicas_in_sync

    def _split(self, split, batch_size, shuffle, repeat, seed, augment=None,
               batch_augment=None, pre_batching_callback=None,
               post_batching_callback=None, data_service=None, preview=False, spec=None,
               random_resized_crop=None):
        seed = config_lib.check_seed(seed)
        random_resized_crop = crop.RandomResizedCrop.from_argument(random_resized_crop)
        config_lib.check_bool("shuffle", shuffle)
        config_lib.check_bool("repeat", repeat)
        runtime = self._config.runtime
        batch_size = config_lib.check_batch_size(
            runtime.batch_size if batch_size == "default" else batch_size
        )
        augmentations = augment_lib.resolve(
            augment, batch_augment, pre_batching_callback, post_batching_callback,
            batched=batch_size is not None,
        )
        if data_service is not None:
            distribute.check_data_service(data_service, self.strategy)
        check = functools.partial(self._check_augmentations, augmentations)
        # Before an export (once the layout is found), and for a cache read
        # as it is.
        meta = self._metadata(check=check)
        check(meta.problem)
        if random_resized_crop is not None and meta.problem == "text":
            raise ValueError("`random_resized_crop` crops images: this dataset holds text.")
        guard = self._source.guard(meta)
        slices = None if spec is None else self._slices(spec, meta, batch_size)
        if slices is None:
            meta.split(split)
        names = (split,) if slices is None else slices.splits
        read, built = augment_lib.read_options_for_split(
            self._read, self._built_splits, spec or split, augmentations, meta.label_spec,
            preview,
        )
        if not preview:  # A preview's switch is its own.
            self._read, self._built_splits = read, built
        for name in names:
            problems.get(meta.problem).check_split(
                name, meta.splits[name].stats, read, augmentations
            )
        seed = runtime.seed if seed is None else seed
        dataset = pipeline.build_split(
            meta, self.cache_dir, names[0], read, self._config.runtime, self.strategy,
            batch_size, augmentations, slices=slices, shuffle=shuffle, repeat=repeat,
            seed=augment_lib.read_seed(seed), data_service=data_service, guard=guard,
            random_resized_crop=random_resized_crop,
        )
        for augmentation in augmentations:
            if augmentation is not None:
                # From the caller of train(); only about a seed it passed.
                augmentation.warn_pending(warn=seed is not None)
        return dataset

    def _check_augmentations(self, augmentations, problem_name):
        problem = problems.get(problem_name)
        for augmentation in augmentations:
            if augmentation is not None:
                problem.check_augmentation(augmentation, self._read)

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
        random_resized_crop=None,
    ):
        """The training split as a `tf.data.Dataset` of `(x, y)` batches.

        Shuffled and batched, it is read by index, a permutation of the
        split per epoch, and `callbacks.BackupAndRestore` resumes it
        mid-epoch (see docs/resume.md).

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
            random_resized_crop: True (torchvision's `RandomResizedCrop`:
                area in (0.08, 1), aspect ratio in (3/4, 4/3)) or `(scale,
                ratio)`: each image is decoded within a random window alone,
                then resized to `image_size` (see docs/augmentation.md). Its
                window is drawn from `(seed, epoch, record)`. The decoded
                cache is off for the split.

        Raises:
            TypeError: an augmentation is not a layer or callable.
            ValueError: an augmentation fails on the element, or returns
                something else than the element dict; the message names it.
            RuntimeError: the cache was exported again (by another dataset
                sharing its `cache_dir`) after this dataset read it.
        """
        shuffle = self._config.runtime.shuffle if shuffle is None else shuffle
        return self._split(
            "train", batch_size, shuffle, repeat, seed,
            augment, batch_augment, pre_batching_callback, post_batching_callback,
            data_service, random_resized_crop=random_resized_crop,
        )

    def val(self, *, batch_size="default", shuffle=False, repeat=False, seed=None,
            augment=None, batch_augment=None):
        """The validation split (not shuffled or augmented by default); see `train()`."""
        return self._split("val", batch_size, shuffle, repeat, seed, augment, batch_augment)

    def test(self, *, batch_size="default", shuffle=False, repeat=False, seed=None,
             augment=None, batch_augment=None):
        """The test split, when the source has one; see `train()`."""
        return self._split("test", batch_size, shuffle, repeat, seed, augment, batch_augment)

    def split(self, spec, *, batch_size="default", shuffle=None, repeat=False, seed=None,
              augment=None, batch_augment=None, random_resized_crop=None):
        """Slices of splits as TFDS spells them (`"train[:10%]+val"`,
        `"train[-500:]"`), read as `train()` reads (its arguments): bounds
        are examples or percents (TFDS's rounding), in the stored order,
        which the export shuffled. See docs/getting_started.md. The
        dataset's `num_examples` counts the slice; `file_paths(spec)` names
        its files.

        Raises:
            ValueError: the spec does not parse, names no split, or has
                parts that are empty or overlap; or `batch_size=None`.
        """
        shuffle = self._config.runtime.shuffle if shuffle is None else shuffle
        dataset = self._split(
            None, batch_size, shuffle, repeat, seed, augment, batch_augment, spec=spec,
            random_resized_crop=random_resized_crop,
        )
        dataset.num_examples = self._slices(spec, self._metadata(), 0).num_examples
        return dataset

    def _slices(self, spec, meta, batch_size):
        if batch_size is None:
            raise ValueError("split() reads in batches: pass a `batch_size`, not None.")
        return slicing.parse(spec, meta.num_examples)

    def file_paths(self, split):
        """The source file of each example of `split`, in the order that
        `ds.<split>(shuffle=False)` yields them, as Keras's
        `dataset.file_paths`: to match predictions to files. (The order is
        the export's, in which the classes are interleaved: not Keras's.)
        An example from a JSON or CSV file is `<file>#<id>`. `split` may be
        a slice spec (see `split()`): its files, in the slice's order.

        Raises:
            ValueError: no such split, or a datum export, which stores no
                file names.
        """
        meta = self._metadata()
        if split in meta.splits:
            return self._source.file_paths(meta, split)
        slices = slicing.parse(split, meta.num_examples)
        return slices.file_paths(lambda name: self._source.file_paths(meta, name))

    def __repr__(self):
        return f"DatumDataset({self.source!r}, cache_dir={self.cache_dir!r})"
