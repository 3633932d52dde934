"""The tf.data read path: shards -> examples -> decoded inputs -> batches.

`build` makes a `read_plan.ReadPlan`, every decision of the read path made
once, and runs the stages it describes, each a small function here:
records -> decoded examples -> cache -> shuffle -> augment -> batch ->
batch augment -> finish -> service -> options and prefetch. The shard
files are read in `shard_reader`, one example is decoded in `decoding`,
and the block path (same-size raw pixels, nothing per example) decodes
and batches whole blocks in `blocks`.

Everything here is graph code: no Python runs per example.
"""

import functools

import tensorflow as tf

from keras_datum import blocks
from keras_datum import decoded_store
from keras_datum import decoding
from keras_datum import distribute
from keras_datum import epochs
from keras_datum import memory
from keras_datum import positions
from keras_datum import read_guard
from keras_datum import read_plan
from keras_datum import shard_reader
from keras_datum import streams

AUTOTUNE = tf.data.AUTOTUNE

def _records(plan):
    """The reader's serialized examples (see `shard_reader`): in the
    reader's blocks when whole blocks decode from them as they come
    (`plan.from_blocks`), else one at a time (with their places, to name a
    failing one); then this reader's share when shared by example."""
    if plan.from_blocks:
        dataset = shard_reader.serialized_blocks(
            plan.paths, plan.counts, False, plan.seed, plan.ordered_reads, plan.block, plan.guard
        )
    else:
        dataset = shard_reader.serialized(
            plan.paths, plan.counts, plan.num_examples, plan.shuffle_files, plan.seed,
            plan.ordered_reads, plan.whole, plan.block, plan.guard, places=plan.places,
        )
    if plan.sharding == read_plan.SHARD_BY_EXAMPLE:
        index, count = plan.shard_subset
        dataset = dataset.shard(count, index)
    return dataset


def _decoded(dataset, plan, then=decoding.unchanged, finite=True):
    """Serialized examples -> decoded dicts, with `then` applied (fused).

    Whole-batch decoding unbatches, which forgets the count: it is
    asserted again when this reader sees the whole split, once."""
    if plan.raw_layout is None:
        return _guarded_decode(dataset, plan, then)
    decode = blocks.batch_decoder(plan.meta, plan.options, plan.raw_layout)
    if not plan.from_blocks:
        dataset = dataset.batch(blocks.DECODE_BATCH)
    dataset = decode(dataset, plan.deterministic, then).unbatch()
    if plan.whole and finite:
        dataset = shard_reader.with_count(dataset, plan.num_examples)
    return dataset


def _guarded_decode(dataset, plan, then):
    """Serialized examples decoded one at a time, with `then` applied, each
    decode guarded (see `read_guard`): a failing example raises naming it,
    or with `on_invalid="skip"` is skipped and reported."""
    meta, options, split = plan.meta, plan.options, plan.split
    decode = lambda s: then(decoding.decode_example(s, meta, options))
    if meta.in_place:
        dataset = read_guard.labels_checked(dataset, meta.json)
    if plan.on_invalid == "raise":
        def guard(examples, number, quiet=False):
            return read_guard.naming_decode(examples, decode, plan.paths, split)
    else:
        service = bool(plan.data_service)

        def guard(examples, number, quiet=False):
            return read_guard.skipping_decode(examples, decode, split, service, quiet, number)

    def guarded(quiet=False):
        return read_guard.in_blocks(dataset, functools.partial(guard, quiet=quiet))
    # The guard drops failing examples, so tf.data no longer knows the
    # count: it is asserted again, as the stream before the guard had it.
    count = tf.get_static_value(dataset.cardinality())
    if count is None or count == tf.data.UNKNOWN_CARDINALITY:
        return guarded()
    if count == tf.data.INFINITE_CARDINALITY or plan.on_invalid == "raise":
        return shard_reader.with_count(guarded(), count)
    # The epoch keeps its length (Keras's steps, `len()`): the places of
    # skipped examples go to the first examples of a second, quiet pass,
    # which is only read when an example was skipped.
    passes = tf.data.Dataset.range(2).flat_map(lambda second: guarded(quiet=second > 0))
    return shard_reader.with_count(passes.take(count), count)


def _cached_pixels(plan):
    """The cast of decoded pixels to the uint8 that the cache keeps."""
    return decoding.pixels_as(tf.uint8, plan.options.interpolation)


def _shuffled(dataset, plan):
    """Examples shuffled and repeated, as the plan says."""
    if plan.shuffle:
        dataset = dataset.shuffle(plan.buffer, seed=plan.seed, reshuffle_each_iteration=True)
    if plan.repeat:
        dataset = dataset.repeat()
    return dataset


def _examples(plan):
    """The per-example path up to the batches: the split's decoded
    examples, one at a time, cached, shuffled and repeated as planned."""
    dataset = _records(plan)
    if plan.cache:
        # Decode once, keep uint8 pixels at the target size in memory, and
        # shuffle the decoded elements: later epochs decode nothing. The
        # cast back to float32 waits for the batch when nothing per example
        # needs floats, so a cached epoch costs a few operations per batch.
        dataset = _decoded(dataset, plan, then=_cached_pixels(plan)).cache()
    dataset = _shuffled(dataset, plan)
    if not plan.cache:
        # Serialized records are shuffled: decoded after.
        dataset = _decoded(dataset, plan, finite=not plan.repeat)
    return dataset


def _block_path(plan):
    """The block path up to the batches: blocks of records are decoded,
    cached, shuffled and cut into batches as blocks, with nothing per
    example (see `blocks.block_batches`). Returns the batches and the
    decoded labels' spec."""
    records = shard_reader.serialized_blocks(
        plan.paths, plan.counts, plan.shuffle_files, plan.seed, plan.ordered_reads, plan.block,
        plan.guard,
    )
    decode = blocks.batch_decoder(plan.meta, plan.options, plan.raw_layout)
    decoded = decode(
        records, plan.deterministic, _cached_pixels(plan) if plan.cache else decoding.unchanged
    )
    if plan.cache:
        decoded = decoded.cache()
    labels_spec = decoded.element_spec.get("labels")
    batches = blocks.block_batches(
        decoded, plan.batch_size, plan.shuffle, plan.repeat, plan.seed, plan.deterministic,
        plan.buffer, plan.block,
        max_blocks=plan.max_blocks,
        num_examples=plan.num_examples if plan.whole else None,
        # The last step runs on whole windows when nothing works on batches
        # and a window's float pixels stay small: one step per batch fewer.
        then=_finisher(plan, labels_spec) if plan.early_finish else None,
        ahead=plan.windows_ahead,
    )
    return batches, labels_spec


def _int_labels(labels_spec):
    """Whether the labels read are integers (class indices)."""
    return labels_spec is not None and labels_spec.dtype.is_integer


def _reseed(plan):
    """With a seed, the augmentations restart their random generators, so
    that the augmented stream repeats exactly."""
    for augmentation in (plan.augment, plan.batch_augment):
        if augmentation is not None and plan.seed is not None:
            augmentation.reseed(plan.seed)


def _augmented(dataset, plan, augmentation, labels_spec, then=None, places=False):
    """`augmentation` (none when None) on what the layers take: float32
    pixels (cached ones are uint8) and float32 labels. KerasCV layers mix
    float and integer labels across their branches (RandAugment fails on
    int32); class indices survive the round trip exactly. `then(outputs,
    options)` puts the result back in the problem's form (boxes to
    `max_boxes`). With `places`, elements are `(inputs, (epochs, record
    ids))` and, with a seed, each draws from its place alone (a batch from
    its first example's: see `Augmentation.seeded`)."""
    if augmentation is None:
        return dataset
    int_labels = _int_labels(labels_spec)
    to_float = decoding.pixels_as(tf.float32)
    options = plan.options

    def apply(inputs, place=None):
        inputs = to_float(inputs)
        if int_labels:
            inputs["labels"] = tf.cast(inputs["labels"], tf.float32)
        if place is None or plan.seed is None:
            outputs = augmentation(inputs)
        else:
            epoch, record = (tf.reshape(p, [-1])[0] for p in place)
            outputs = augmentation.seeded(inputs, epoch, record)
        return outputs if then is None else then(outputs, options)

    if places:
        return dataset.map(
            lambda inputs, place: (apply(inputs, place), place),
            num_parallel_calls=plan.augment_calls,
        )
    return dataset.map(apply, num_parallel_calls=plan.augment_calls)


def _batched(dataset, plan):
    """Examples -> batches: the problem's own batching (with its count when
    known), or plain batches; the block path's are made already."""
    problem = plan.problem
    if problem.batches_itself:
        dataset = problem.batch(dataset, plan.batch_size, plan.options)
        count = (
            problem.batch_count(plan.paths, plan.batch_size, plan.options)
            # An augment step may change what the batches are made by.
            if plan.count_batches
            else None
        )
        if count is not None:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    elif plan.batch_size is not None and not plan.block_path:
        dataset = dataset.batch(
            plan.batch_size, num_parallel_calls=AUTOTUNE, deterministic=plan.deterministic
        )
    return dataset


def _finisher(plan, labels_spec):
    """The pipeline's last step, on examples or batches of them: images in
    the plan's `image_dtype` (cached ones are uint8), labels back in
    `labels_spec`'s dtype, as read (augmentation takes them as float32),
    then the problem's `(x, y)`. Images leaving as uint8 are rounded, and
    clipped unless `plan.resized_by` (the interpolation, when nothing ran
    after the resize) cannot have left [0, 255]; uint8 images pass
    untouched."""
    int_labels = _int_labels(labels_spec)
    to_float = decoding.pixels_as(tf.float32)
    image_dtype = tf.as_dtype(plan.image_dtype)
    problem, resized_by = plan.problem, plan.resized_by

    def finish(inputs):
        inputs = dict(inputs)
        images = inputs.pop("images", None)
        inputs = to_float(inputs)
        if images is not None:
            if image_dtype != tf.uint8:
                images = tf.cast(images, image_dtype)
            elif images.dtype != tf.uint8:
                images = decoding.rounded_uint8(images, resized_by)
            inputs["images"] = images
        if int_labels:
            inputs["labels"] = tf.cast(inputs["labels"], labels_spec.dtype)
        return problem.to_keras(inputs)

    return finish


def _finished(dataset, plan, labels_spec, places=False, keep_epoch=False):
    """The last step (see `_finisher`), unless the block path ran it on its
    windows. Batches of small raw-pixel images cast in a moment: one at a
    time, ahead of the consumer (the prefetch), holds fewer in memory. With
    `places`, the elements are `(batch, places)` and lose their places
    (with `keep_epoch`, they become `(batch, its epoch)`)."""
    finish = (lambda inputs: inputs) if plan.early_finish else _finisher(plan, labels_spec)
    if not places:
        if plan.early_finish:
            return dataset
        return dataset.map(finish, num_parallel_calls=plan.finish_calls)

    # One function: each costs every iterator (epoch) its instantiation.
    def last(inputs, place):
        return (finish(inputs), place[0][0]) if keep_epoch else finish(inputs)

    return dataset.map(last, num_parallel_calls=plan.finish_calls)


def _served(dataset, plan):
    """Everything so far on tf.data service workers, with a data service."""
    if not plan.data_service:
        return dataset
    # DYNAMIC sharding hands each shard file to one worker per epoch, so
    # every example is produced exactly once per epoch (at most once if a
    # worker dies mid-epoch).
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=plan.data_service,
        )
    )


def _with_options(dataset, plan):
    """The dataset's `tf.data.Options`, then the prefetch."""
    options = tf.data.Options()
    # tf.data's default graph rewrites run at every iterator creation, that
    # is every epoch, and cost more than they save here: the parallelism and
    # the prefetching above are placed by hand (measured with
    # benchmarks/run.py: about 20 ms less per epoch, up to 12% on a small
    # split's first epoch).
    options.experimental_optimization.apply_default_optimizations = False
    if plan.shard_policy is not None:
        options.experimental_distribute.auto_shard_policy = plan.shard_policy
    return dataset.with_options(options).prefetch(AUTOTUNE)


def _stream_examples(plan, state):
    """A stream's decoded examples, each `(example, place)` (`place` is
    `(epoch, record id)`, what seeds its augmentation), or batches of them
    (with the decoded cache, or raw pixels decoded whole): `(dataset,
    batched, store)`, `store` the decoded cache (`None` without)."""
    records = streams.read_batches(plan, state)
    then = _cached_pixels(plan) if plan.cache else decoding.unchanged
    batched = plan.raw_layout is not None
    if batched:
        decode = blocks.batch_decode(plan.meta, plan.options, plan.raw_layout)
        decoded = streams.decoded_batches(records, decode, then)
    else:
        decoded = streams.decoded_examples(records, plan, then, state.seed)
    if not plan.cache:
        return decoded, batched, None
    if not batched:
        decoded = decoded.batch(plan.batch_size, num_parallel_calls=AUTOTUNE, deterministic=True)
    spec = tf.nest.map_structure(
        lambda s: tf.TensorSpec(s.shape[1:], s.dtype), decoded.element_spec[0]
    )
    store = decoded_store.DecodedStore(plan.table.num_examples, spec)
    return streams.with_store(decoded, plan, state, store), True, store


def _stream_batches(examples, plan, labels_spec):
    """Examples with their places -> batches with theirs (the per-example
    augmentation first)."""
    examples = _augmented(examples, plan, plan.augment, labels_spec, places=True)
    if not plan.problem.batches_itself:
        return examples.batch(plan.batch_size, num_parallel_calls=AUTOTUNE, deterministic=True)
    # The problem batches dicts: the places go along as a key.
    merged = examples.map(lambda inputs, place: dict(inputs, _place=place))
    batches = plan.problem.batch(merged, plan.batch_size, plan.options)

    def split(inputs):
        inputs = dict(inputs)
        return inputs, inputs.pop("_place")

    return batches.map(split)


def _stream(plan, state):
    """The resumable stream of `plan` (see `streams`), at `state`'s
    positions."""
    n = plan.table.num_examples
    steps = (
        tf.data.INFINITE_CARDINALITY
        if plan.repeat
        else positions.steps_per_epoch(n, plan.batch_size)
    )
    running = None if plan.cache else _running_decode(plan, state)
    if running is not None:
        # Its one epoch: the same batches, without a second pipeline to build.
        return epochs.Epochs(epochs.one_epoch_of(running.dataset, steps), steps, state,
                              running=running)
    examples, batched, store = _stream_examples(plan, state)
    labels_spec = examples.element_spec[0].get("labels")
    _reseed(plan)
    dataset = _stream_tail(examples, batched, plan, labels_spec)
    stored = None
    if store is not None and not plan.repeat:
        claims = epochs.Claims(state)
        kept = _stored_tail(plan, claims, store, labels_spec, running=True)
        running = epochs.Running(kept, state, n, plan.batch_size, store, plan.guard,
                                  claims=claims)
    elif store is not None:
        stored = (_stored_tail(plan, state, store, labels_spec), store)
    return epochs.Epochs(dataset, steps, state, stored, running)


def _stored_tail(plan, state, store, labels_spec, running=False):
    """The stream read from its complete decoded cache alone (see
    `epochs.Epochs`): with nothing to augment, the gather and the last
    step are one function. With `running`, its epochs in sequence (see
    `epochs.Running`): a per-example `augment` batches them again, so
    each epoch is padded to whole batches, and the pads dropped after."""
    if plan.augment is None and plan.batch_augment is None and not plan.early_finish:
        finish = _finisher(plan, labels_spec)
        batches = streams.stored_batches(plan, state, store, then=finish, running=running)
        return _with_options(batches, plan)
    pad = running and plan.augment is not None
    batches = streams.stored_batches(plan, state, store, running=running, pad=pad)
    return _stream_tail(batches, True, plan, labels_spec, padded=pad)


def _running_decode(plan, state):
    """The decoding stream's epochs in sequence, each batch with its
    epoch (see `epochs.Running`): each batch of records is decoded (and
    augmented per example) into one batch in a dataset of its own, whose
    functions an iterator instantiates once, so that a skipped example
    (`on_invalid="skip"`) leaves its batch shorter instead of moving the
    batches after it into the next epoch. None for what batches itself,
    repeats, or checks each example on blocks (naming it, or a datum
    export's labels)."""
    if (plan.repeat or plan.problem.batches_itself or plan.on_invalid == "raise"
            or plan.meta.in_place):
        return None
    raw = plan.raw_layout is not None
    decode_batch = blocks.batch_decode(plan.meta, plan.options, plan.raw_layout) if raw else None
    _reseed(plan)
    labels = {}  # The labels' spec as read, which the last step casts back to.

    def one_batch(*records):
        record = tf.data.Dataset.from_tensors(records)
        if raw:
            examples = streams.decoded_batches(record, decode_batch, decoding.unchanged)
            labels["spec"] = examples.element_spec[0].get("labels")
            if plan.augment is None:
                return examples
            examples = examples.unbatch()
        else:
            examples = streams.decoded_examples(record, plan, decoding.unchanged, state.seed)
            labels["spec"] = examples.element_spec[0].get("labels")
        return _stream_batches(examples, plan, labels["spec"])

    records = streams.read_batches(plan, state, running=True)
    if plan.augment is not None and plan.augment_calls is None:
        # A seeded augmentation runs one example at a time, in order (see
        # `read_plan`): so do the batches it runs in.
        batches = records.interleave(one_batch, cycle_length=2)
    else:
        batches = records.interleave(one_batch, cycle_length=2, num_parallel_calls=2,
                                     deterministic=True)
    dataset = _stream_tail(batches, True, plan, labels["spec"], augmented=True,
                           keep_epoch=True)
    return epochs.Running(dataset, state, plan.table.num_examples, plan.batch_size,
                           guard=plan.guard, with_epochs=True)


def _stream_tail(examples, batched, plan, labels_spec, padded=False, augmented=False,
                 keep_epoch=False):
    """A stream's (batches of) examples with their places -> the batches
    `model.fit` takes: augmented, finished, with options and prefetch
    (`padded`: batches padded with record id -1, dropped once batched
    again, see `streams.stored_batches`; `augmented`: batches augmented
    per example already; `keep_epoch`: each batch with its epoch)."""
    if batched and plan.augment is not None and not augmented:
        examples, batched = examples.unbatch(), False
    batches = examples if batched else _stream_batches(examples, plan, labels_spec)
    if padded:
        batches = streams.without_pads(batches)
    batches = _augmented(
        batches, plan, plan.batch_augment, labels_spec,
        then=plan.problem.after_batch_augment, places=True,
    )
    batches = _finished(batches, plan, labels_spec, places=True, keep_epoch=keep_epoch)
    return _with_options(batches, plan)


def from_plan(plan, state=None):
    """The `tf.data.Dataset` that a `read_plan.ReadPlan` describes; a
    stream's at the positions of `state` (a `positions.StreamState`)."""
    if plan.stream:
        return _stream(plan, state)
    if plan.block_path:
        dataset, labels_spec = _block_path(plan)
    else:
        dataset = _examples(plan)
        labels_spec = dataset.element_spec.get("labels")
    _reseed(plan)
    dataset = _augmented(dataset, plan, plan.augment, labels_spec)
    dataset = _batched(dataset, plan)
    dataset = _augmented(
        dataset, plan, plan.batch_augment, labels_spec, then=plan.problem.after_batch_augment
    )
    dataset = _finished(dataset, plan, labels_spec)
    dataset = _served(dataset, plan)
    return _with_options(dataset, plan)


def build(
    meta,
    cache_dir,
    split,
    options,
    *,
    batch_size,
    shuffle,
    repeat,
    seed,
    shuffle_buffer_size,
    augment=None,
    batch_augment=None,
    image_dtype="float32",
    shard_policy=None,
    cache=False,
    data_service=None,
    shard_subset=None,
    guard=None,
    on_invalid="raise",
    slices=None,
    split_name=None,
    replicas=1,
    random_resized_crop=None,
):
    """The `tf.data.Dataset` of `(x, y)` batches for one split.

    `augment` runs on each decoded example, `batch_augment` on each batch,
    both on the KerasCV dict. With a `seed` they run in order on one thread
    (after restarting their random generators), so the augmented stream
    repeats exactly; without one they run in parallel. With `cache`, the
    decoded, resized pixels are kept in memory as uint8 after the first
    epoch (see `memory.decoded_bytes`). With `data_service` (a dispatcher address),
    everything up to the batches runs on tf.data service workers. With
    `shard_subset=(index, count)` this pipeline reads only every `count`-th
    shard file from the `index`-th: one worker's share of the split (every
    `count`-th example when there are fewer files than workers). With
    `guard` (see `shard_reader._guarded`), a cache exported over since is
    refused. An example that fails to decode raises naming it, or with
    `on_invalid="skip"` is skipped and reported (see `read_guard`). With
    `random_resized_crop` (a `crop.RandomResizedCrop`), each image is
    decoded within its crop window alone (see `crop`).

    What each of these means for the pipeline is decided once, in a
    `read_plan.ReadPlan`; `from_plan` builds it.
    """
    plan = read_plan.ReadPlan.make(
        meta, cache_dir, split, options,
        batch_size=batch_size, shuffle=shuffle, repeat=repeat, seed=seed,
        shuffle_buffer_size=shuffle_buffer_size, augment=augment, batch_augment=batch_augment,
        image_dtype=image_dtype, shard_policy=shard_policy, cache=cache,
        data_service=data_service, shard_subset=shard_subset, guard=guard,
        on_invalid=on_invalid, slices=slices, random_resized_crop=random_resized_crop,
    )
    return from_plan(plan, _stream_state(plan, split_name or split, replicas))


def _stream_state(plan, split_name, replicas):
    """The `positions.StreamState` of a stream's plan, or None. A shuffled
    split read otherwise notes why it cannot resume (see `callbacks`)."""
    if not plan.stream:
        if plan.shuffle and plan.batch_size is not None:
            positions.note_unresumable(_why_no_stream(plan))
        return None
    spec = positions.StreamSpec(
        split=split_name, export=positions.export_identity(plan.meta.json),
        num_examples=plan.table.num_examples, batch_size=plan.batch_size, replicas=replicas,
        repeat=plan.repeat, shuffle=plan.shuffle,
    )
    limits = []
    if plan.seed is None and (plan.augment is not None or plan.batch_augment is not None):
        limits.append("augmentation without a seed draws anew after a restart (pass `seed=`)")
    if plan.seed is None and plan.options.random_resized_crop is not None:
        limits.append("`random_resized_crop` without a seed draws anew after a restart")
    if plan.table.share[1] > 1:
        limits.append("on a multi-worker strategy each worker resumes the chief's position")
    if not plan.problem.batches_in_order(plan.options):
        limits.append("bucketed batches (`bucket_boundaries`) do not follow the positions")
    return positions.StreamState(spec, plan.seed, limits)


def _why_no_stream(plan):
    if plan.data_service:
        return "tf.data service (`data_service=`)"
    if plan.sharding != read_plan.SHARD_NONE:
        return "a multi-worker strategy (each worker reads its own shard files)"
    if plan.cache and not plan.problem.fixed_examples:
        return f"the decoded cache on {plan.meta.problem} examples (`cache=False` resumes)"
    return "bucketed batches (`bucket_boundaries`)"


def build_split(meta, cache_dir, split, read, runtime, strategy, batch_size, augmentations,
                slices=None, **options):
    """A split's pipeline on `strategy`: `build` with the dataset's
    `config.RuntimeOptions`, at the global batch size (`batch_size` per
    replica), each worker's share for a multi-worker strategy. With
    `slices` (a `slicing.Slices`), those slices: the decoded cache when
    every split they read would get it."""
    names = (split,) if slices is None else slices.splits
    if batch_size is not None:
        batch_size *= strategy.num_replicas_in_sync
    split_build = functools.partial(
        build, meta, cache_dir, split, read,
        shuffle_buffer_size=runtime.shuffle_buffer_size,
        augment=augmentations[0],
        batch_augment=augmentations[1],
        image_dtype=read.image_dtype or distribute.input_dtype(),
        cache=all(memory.decoded_cache(runtime, meta, name, read)[0] for name in names),
        on_invalid=runtime.on_invalid,
        replicas=strategy.num_replicas_in_sync,
        slices=slices,
        split_name=None if slices is None else slices.spec,
        **options,
    )
    num_files = sum(len(meta.splits[name].filled_shards) for name in names)
    return distribute.distributed_dataset(strategy, split_build, batch_size, num_files)
