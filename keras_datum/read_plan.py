"""What the read path of one split does, decided once (see `ReadPlan`).

`pipeline.build` makes a plan from the split's metadata, the read options
and its own arguments, then runs the stages the plan describes. The
decisions are plain Python values, made before any `tf.data` op exists, so
they can be read and tested without building a pipeline.
"""

import dataclasses
from typing import Any

import tensorflow as tf

from keras_datum import blocks
from keras_datum import images
from keras_datum import problems
from keras_datum import record_index
from keras_datum import shard_reader

AUTOTUNE = tf.data.AUTOTUNE
# Encoded examples held for shuffling. With the write-time shuffle and the
# interleave of several shards, a few thousand already mixes the classes well.
DEFAULT_SHUFFLE_BUFFER = 2048
# Float pixels of a window (the shuffle buffer) at most this big get the
# pipeline's last step before the cut into batches (see `ReadPlan`).
EARLY_FINISH_BYTES = 64 * 1024 * 1024

# How a split is shared between input pipelines (`ReadPlan.sharding`).
SHARD_NONE = "none"
SHARD_BY_FILE = "file"
SHARD_BY_EXAMPLE = "example"


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """Everything the read path of one split does, decided once.

    The stages run in this order: records -> decoded examples -> cache ->
    shuffle (and repeat) -> augment -> batch -> batch augment -> finish ->
    data service -> options and prefetch. There are two pipelines:

    - the block path (`block_path`): same-size raw-pixel images batched
      with nothing per example. Blocks of records are decoded whole,
      cached, shuffled and cut into batches as blocks.
    - the per-example path: examples are decoded one at a time (or in
      blocks, then unbatched), shuffled, augmented and batched one by one.

    Attributes:
        meta: the export's `metadata.Metadata`.
        split: the split's name.
        options: the `config.ReadOptions`, with the split's export stats
            (`stored_images`), so that the image decoder chooses its path once.
        problem: the problem (`problems.base.Problem`) of the export.
        paths: the shard files this reader reads: the split's that hold
            examples, or this reader's share of them (`SHARD_BY_FILE`).
        counts: the examples each of `paths` holds.
        num_examples: the examples of `paths`.
        block: records read and counted at a time
            (`shard_reader.block_records`).
        guard: `(metadata path, export key)`, checked as each shard file
            opens (see `shard_reader`), or None.
        sharding: how this reader shares the split with others
            (`shard_subset`): `SHARD_NONE` (it reads all of it),
            `SHARD_BY_FILE` (every `count`-th file from the `index`-th) or
            `SHARD_BY_EXAMPLE` (every `count`-th example: a split with
            fewer files than readers).
        shard_subset: `(index, count)`: this reader's share, or None.
        whole: whether this reader sees the whole split (no data service,
            not shared by example), so that the split's count (and the
            epoch's length) can be asserted.
        raw_layout: the split's `blocks.RawLayout` when whole blocks of
            records decode at once, else None: each example is decoded on
            its own, guarded by `read_guard`.
        block_path: whether the block path runs: blocks decode whole, the
            examples are batched, nothing works on single examples
            (`augment`), the problem batches plainly and the split is not
            shared by example.
        cache: whether the decoded examples (uint8 pixels at the target
            size) are kept in memory after the first epoch. Never with a
            data service: each worker gets other shards in every epoch.
        shuffle: whether the examples are shuffled.
        shuffle_files: whether the order of the shard files is shuffled too:
            not for a cache (it keeps its first order), nor when shared by
            example (every reader needs the same record order).
        buffer: the examples shuffled together (the shuffle buffer, or the
            block path's window).
        repeat: whether the examples repeat without end.
        seed: the shuffles' and the augmentation's seed, or None.
        deterministic: whether parallel steps keep their order: without a
            shuffle, or with a seed (the stream then repeats exactly).
        ordered_reads: whether the interleaved reading of the shard files
            keeps its order: when `deterministic`, and when shared by
            example (each reader takes every `count`-th of one order).
        from_blocks: per-example path: whole-block decoding takes the
            reader's blocks as they come (cached or unshuffled, not shared
            by example) instead of shuffled records batched again.
        places: per-example path: records come with their places (shard,
            index) so that one failing to decode is named
            (`on_invalid="raise"`).
        on_invalid: `"raise"` or `"skip"`: an example that fails to decode.
        max_blocks: block path with a cache: the blocks shuffled at once
            (cached blocks are references: many can take part); else None
            (about a window's worth).
        early_finish: block path: the last step (`finish`) runs on whole
            windows before the cut into batches, one step per batch fewer:
            when nothing works on batches and a window's float pixels stay
            under `EARLY_FINISH_BYTES`.
        windows_ahead: block path: the next window is made while one is cut
            into batches (windows that small).
        batch_size: the examples of a batch, or None (no batches).
        count_batches: whether a problem that batches itself asserts its
            batch count (a whole, finite, unaugmented split).
        augment: the augmentation of each decoded example, or None.
        batch_augment: the augmentation of each batch, or None.
        augment_calls: the augmentations' parallelism: AUTOTUNE, or None (one
            thread, in order) with a seed, so that the augmented stream
            repeats exactly.
        finish_calls: the last step's parallelism: the block path's batches
            of small images cast in a moment, one at a time (fewer held in
            memory); else AUTOTUNE.
        resized_by: the interpolation when nothing ran after the resize (no
            augmentation), whose pixels cannot leave [0, 255] for some
            methods; else None (uint8 output is clipped).
        image_dtype: the dtype of the images handed out.
        data_service: a tf.data service dispatcher address, or None.
        shard_policy: tf.data's auto-shard policy, or None.
        stream: whether the split (or slice) is read as a resumable stream
            (see `streams`): with random access, in an order drawn from
            `(seed, epoch)`, each iterator starting where the stream's
            `positions.StreamState` says. For shuffled batches of a split
            read whole by one pipeline whose problem batches in order, and
            for every slice.
        table: the `record_index.RecordTable` a stream reads, or None.
    """

    meta: Any
    split: str
    options: Any
    problem: Any
    paths: tuple[str, ...]
    counts: tuple[int, ...]
    num_examples: int
    block: int
    guard: Any
    sharding: str
    shard_subset: tuple[int, int] | None
    whole: bool
    raw_layout: blocks.RawLayout | None
    block_path: bool
    cache: bool
    shuffle: bool
    shuffle_files: bool
    buffer: int
    repeat: bool
    seed: int | None
    deterministic: bool
    ordered_reads: bool
    from_blocks: bool
    places: bool
    on_invalid: str
    max_blocks: int | None
    early_finish: bool
    windows_ahead: bool
    batch_size: int | None
    count_batches: bool
    augment: Any
    batch_augment: Any
    augment_calls: int | None
    finish_calls: int | None
    resized_by: str | None
    image_dtype: Any
    data_service: str | None
    shard_policy: Any
    stream: bool
    table: Any

    @classmethod
    def make(
        cls, meta, cache_dir, split, options, *, batch_size, shuffle, repeat, seed,
        shuffle_buffer_size, augment=None, batch_augment=None, image_dtype="float32",
        shard_policy=None, cache=False, data_service=None, shard_subset=None, guard=None,
        on_invalid="raise", slices=None, random_resized_crop=None,
    ):
        """The plan for one split's pipeline: the arguments are
        `pipeline.build`'s (see there)."""
        table, paths, counts, shard_subset = _records(meta, cache_dir, split, slices, shard_subset)
        sharding = _sharding(len(paths), shard_subset)
        if sharding == SHARD_BY_FILE:
            index, count = shard_subset
            paths, counts = paths[index::count], counts[index::count]
        by_example = sharding == SHARD_BY_EXAMPLE
        problem = problems.get(meta.problem)
        # Slices are read by index alone; the decoded cache of examples that
        # vary in size is not. The fused crop cuts windows from the stored
        # image: the cache (at the target size) is off.
        cache = (
            bool(cache) and not data_service and random_resized_crop is None
            and (slices is None or problem.fixed_examples)
        )
        num_examples = table.num_examples if slices is not None else sum(counts)
        buffer = shuffle_buffer_size or min(DEFAULT_SHUFFLE_BUFFER, max(1, num_examples))
        block = shard_reader.block_records(paths, counts)
        options, layout = _stored(
            meta, (split,) if slices is None else slices.splits, options, random_resized_crop
        )
        stream = _is_stream(problem, options, batch_size, cache, slices, shuffle, sharding,
                            data_service)
        block_path = (
            layout is not None
            and not stream
            and augment is None
            and batch_size is not None
            and not by_example
            and not problem.batches_itself
        )
        small_windows = block_path and _float_bytes(options, buffer) <= EARLY_FINISH_BYTES
        deterministic = not shuffle or seed is not None
        whole = not data_service and not by_example
        # Whole-block decoding on the per-example path takes the reader's
        # blocks as they come, unless serialized records are shuffled before
        # decoding (no cache). Sharing by example needs one record order.
        from_blocks = (
            not block_path and not stream and layout is not None and (cache or not shuffle) and not by_example
        )
        # Cached blocks are references: many can take part in the shuffle
        # (decoded blocks read anew are bounded by `buffer`).
        max_blocks = (
            len(paths) + min(num_examples, blocks.MAX_SHUFFLED_EXAMPLES) // block
            if block_path and cache
            else None
        )
        # Augmentation can move pixels out of [0, 255].
        augmented = augment is not None or batch_augment is not None
        return cls(
            meta=meta, split=split, options=options, problem=problem,
            paths=tuple(paths), counts=tuple(counts), num_examples=num_examples,
            block=block, guard=guard,
            sharding=sharding, shard_subset=shard_subset, whole=whole,
            raw_layout=layout, block_path=block_path,
            cache=cache, shuffle=shuffle,
            shuffle_files=shuffle and not cache and not by_example,
            buffer=buffer, repeat=repeat, seed=seed,
            deterministic=deterministic, ordered_reads=deterministic or by_example,
            from_blocks=from_blocks,
            places=layout is None and on_invalid == "raise",
            on_invalid=on_invalid,
            max_blocks=max_blocks,
            early_finish=small_windows and batch_augment is None,
            windows_ahead=small_windows,
            batch_size=batch_size,
            count_batches=problem.batches_itself and whole and not repeat and augment is None,
            augment=augment, batch_augment=batch_augment,
            augment_calls=AUTOTUNE if seed is None else None,
            finish_calls=None if block_path else AUTOTUNE,
            resized_by=None if augmented else options.interpolation,
            image_dtype=image_dtype, data_service=data_service, shard_policy=shard_policy,
            stream=stream, table=table if stream else None,
        )


def _records(meta, cache_dir, split, slices, shard_subset):
    """`(table, paths, counts, shard_subset)`: the `record_index.RecordTable`
    of the split (or of `slices`), its shard files and their counts (a
    slice's segments), and the share for the file reader. A stream reads a
    worker's share of slices by example, from its table."""
    if slices is None:
        paths, counts = shard_reader.shards(meta, cache_dir, split)
        return record_index.RecordTable.of_shards(paths, counts), paths, counts, shard_subset
    table = record_index.RecordTable(slices.segments(meta, cache_dir))
    paths = [s.path for s in table.segments]
    counts = [s.stop - s.start for s in table.segments]
    if shard_subset is not None:
        table = table.shared(*shard_subset)
    return table, paths, counts, None


def _is_stream(problem, options, batch_size, cache, slices, shuffle, sharding, data_service):
    """Whether the split is read as a resumable stream (see `streams`): a
    shuffled batched read on one worker, and every read of slices or with
    the fused crop, which need one (refused otherwise, saying why)."""
    crop = options.random_resized_crop
    stream = batch_size is not None and (not cache or problem.fixed_examples) and (
        slices is not None
        or ((shuffle or crop is not None) and sharding == SHARD_NONE
            and not data_service and problem.batches_in_order(options))
    )
    if slices is not None and not stream:
        raise ValueError("Slices of splits are read in batches: pass a `batch_size`.")
    if crop is not None and not stream:
        raise ValueError(_crop_refused(batch_size, sharding, data_service))
    return stream


def _crop_refused(batch_size, sharding, data_service):
    """Why `random_resized_crop` cannot be read: it draws each window from
    `(seed, epoch, record)`, which only a stream (see `streams`) knows."""
    if batch_size is None:
        why = "unbatched reads (`batch_size=None`)"
    elif data_service:
        why = "tf.data service (`data_service=`)"
    elif sharding != SHARD_NONE:
        why = "a multi-worker strategy (each worker reads its own shard files)"
    else:
        why = "bucketed batches (`bucket_boundaries`)"
    return (
        "`random_resized_crop` draws each window from (seed, epoch, record) on the read "
        f"by index, which {why} do not take; read without it and crop with a layer in "
        "`augment=` (keras_cv's RandomCropAndResize, say)."
    )


def _stored(meta, names, options, random_resized_crop=None):
    """`(options, raw layout)`: the read options with what the export stats
    of the splits `names` say about their stored images (and the fused
    crop), and their `blocks.RawLayout` (each None unless every split
    agrees; None with the crop: each window is decoded on its own)."""
    options = dataclasses.replace(options, stored_images=_common(
        images.stored_images(meta.splits[name].stats) for name in names
    ), random_resized_crop=random_resized_crop)
    if random_resized_crop is not None:
        return options, None
    return options, _common(blocks.raw_layout(meta, name, options) for name in names)


def _common(values):
    """The value all of `values` share, else None (slices of splits stored
    otherwise are read as any split)."""
    values = list(values)
    return values[0] if all(v == values[0] for v in values) else None


def _sharding(num_files, shard_subset):
    """Each input pipeline (worker) reads its own files; a split with fewer
    files than workers (fewer examples than workers) is shared by example."""
    if shard_subset is None:
        return SHARD_NONE
    return SHARD_BY_EXAMPLE if num_files < shard_subset[1] else SHARD_BY_FILE


def _float_bytes(options, count):
    """Bytes of `count` decoded examples' pixels as float32, as the block
    path decodes them: `options.image_size` with the color mode's channels."""
    height, width = options.image_size
    return 4 * count * height * width * images.CHANNELS[options.color_mode]
