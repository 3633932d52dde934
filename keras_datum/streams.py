"""Resumable streams: a split (or slices of splits) read with random access.

The records are numbered 0..n-1 in stored order (`record_index.RecordTable`).
Epoch `e` hands out position `p` as record `index_shuffle(p, (seed, e))`, a
global shuffle of the whole split by index, as grain does: no shuffle buffer
to fill, so the first batch waits for one batch's decodes. Each iterator of
the dataset claims its start from the stream's `positions.StreamState` as it
starts (the next epoch, or a restored `(epoch, offset)`), so a stream starts
anywhere at the cost of arithmetic, and `callbacks.BackupAndRestore` resumes
`model.fit` mid-epoch.

Per-example randomness (the `augment` steps) is drawn, with a seed, from
`(seed, epoch, record)` alone (`Augmentation.seeded`), and a batch
augmentation's from the batch's records: a resumed stream repeats the
uninterrupted one's batches exactly. The decoded cache is a
`decoded_store.DecodedStore`: random access too.
"""

import os

import numpy as np
import tensorflow as tf

from keras_datum import crop
from keras_datum import decoding
from keras_datum import py_calls
from keras_datum import read_guard
from keras_datum import record_index
from keras_datum import store

AUTOTUNE = tf.data.AUTOTUNE
_NO_END = 2**62
# The third word of the index shuffle's seed.
_SALT = 498247692



def _places(plan, state, running=False, pad=False):
    """Batches of places, `(epochs, record ids, errors)`, of one iterator,
    in the stream's order. The start is claimed from `state` when the
    iterator first asks for an element (see `StreamState.claim`). `errors`
    repeats one string (take `[0]`: batches are never empty): empty, or
    that the cache is no longer the export the stream was built on
    (`plan.guard`, see `store.still_the_export`); errors travel as
    values up to the guard of the decode (see `decoded_examples`). Without
    `repeat` the iterator ends with its epoch (the last batch partial);
    with it, the epochs run into each other. `running` (for `epochs.Running`):
    the epochs follow each other without end, each cut into its own
    batches (with `pad`, each epoch's last batch whole: see
    `stored_batches`). (Plain ops, no dataset made
    per iterator, and few functions, each of which costs an iterator about
    2 ms to instantiate: an epoch's first batch comes at once.)"""
    n, guard = plan.table.num_examples, plan.guard

    def claim():
        # In Python, with the claim: checked in the graph, the export costs
        # every iterator a few more functions to instantiate.
        epoch, offset, seed = state.claim()
        fresh = guard is None or store.still_the_export(guard)
        error = "" if fresh else store.stale_cache_message(os.path.dirname(guard[0]))
        return np.int64(epoch), np.int64(offset), np.int64(seed), np.bytes_(error.encode())

    # Wrapped here, not in the functions traced below: AutoGraph would
    # convert the wrapper at every trace.
    claim_call = py_calls.calls(claim)

    def claimed():
        values = tf.numpy_function(claim_call, [], [tf.int64] * 3 + [tf.string], stateful=True)
        return tuple(tf.reshape(value, []) for value in values)

    def one_epoch(epoch, first, offset, seed, error):
        ids = epoch_ids(seed, epoch, n, plan.shuffle)[tf.where(epoch == first, offset, 0):]
        return tf.fill(tf.shape(ids), epoch), ids, tf.fill(tf.shape(ids), error)

    def claim_epoch():
        # The whole epoch's places in Python, with the claim (the same
        # permutation op, run eagerly): one op in the iterator's function.
        epoch, offset, seed, error = claim()
        ids = epoch_ids(tf.constant(seed), tf.constant(epoch), n, plan.shuffle).numpy()[offset:]
        return np.full(len(ids), epoch, np.int64), ids, np.full(len(ids), error, object)

    epoch_call = py_calls.calls(claim_epoch)

    def claimed_epoch(_):
        places = tf.numpy_function(epoch_call, [], [tf.int64, tf.int64, tf.string], stateful=True)
        for tensor in places:
            tensor.set_shape([None])
        return tuple(places)

    start = tf.data.Dataset.from_tensors(0)
    if not plan.repeat and not running:
        epochs = start.map(claimed_epoch)
    else:
        epochs = start.map(lambda _: claimed()).flat_map(
            lambda first, offset, seed, error: tf.data.Dataset.range(first, _NO_END).map(
                lambda epoch: (epoch, first, offset, seed, error)
            )
        ).map(one_epoch)
    if running:
        return epochs.flat_map(lambda *places: _epoch_batches(places, plan.batch_size, pad))
    return epochs.unbatch().batch(plan.batch_size)


def _epoch_batches(places, batch_size, pad):
    """One epoch's places in batches; with `pad`, the last one filled with
    places of record id -1 (see `stored_batches`)."""
    if pad:
        more = tf.math.floormod(-tf.size(places[1]), batch_size)
        places = tuple(
            tf.concat([values, tf.fill(
                [more], tf.constant(-1, tf.int64) if values.dtype == tf.int64 else values[0]
            )], 0)
            for values in places
        )
    return tf.data.Dataset.from_tensor_slices(places).batch(batch_size)


def epoch_ids(seed, epoch, num_examples, shuffle):
    """The record ids of an epoch, in the order it reads them: position `p`
    reads record `index_shuffle(p, (seed, epoch))`, a permutation of the
    whole split drawn from `(seed, epoch)` alone (or `p`, unshuffled)."""
    places = tf.range(num_examples, dtype=tf.int64)
    if not shuffle or num_examples == 0:
        return places
    # The raw op: `tf.random.experimental.index_shuffle` pads a matrix of
    # seeds along the wrong axis.
    seeds = tf.stack([seed, epoch, tf.constant(_SALT, tf.int64)])
    return tf.raw_ops.RandomIndexShuffle(
        index=places, seed=seeds, max_index=tf.constant(num_examples - 1, tf.int64), rounds=4
    )


def _reader(table):
    """`read(ids, error)`: the records `ids` of `table` (see
    `RecordTable.read`) and the error, given or met (a damaged or missing
    shard, or the interpreter exiting: see `py_calls`), as a value: then
    the records are empty."""

    def nothing(ids, error):
        empty = np.zeros(len(ids), np.int64)
        return np.full(len(ids), b"", object), empty, empty, error

    def read(ids, error):
        if not error:
            try:
                return (*table.read(ids), error)
            except record_index.DamagedShardError as damaged:
                error = str(damaged).encode()
        return nothing(ids, error)

    return py_calls.calls(read, lambda ids, error: nothing(ids, py_calls.EXITING.encode()))


def read_batches(plan, state, running=False):
    """Batches of records: `(records, segments, indices in the shards,
    (epochs, ids), error)`, read with random access in the stream's order;
    `error` empty, or why the batch could not be read (see `raised`).
    `running`: epochs in sequence (see `epochs.Running`)."""
    read = _reader(plan.table)

    def read_batch(epochs, ids, errors):
        records, segments, indices, error = tf.numpy_function(
            read, [ids, errors[0]], [tf.string, tf.int64, tf.int64, tf.string], stateful=False
        )
        for tensor in (records, segments, indices):
            tensor.set_shape([None])
        return records, segments, indices, (epochs, ids), tf.reshape(error, [])

    places = _places(plan, state, running)
    return places.map(read_batch, num_parallel_calls=AUTOTUNE, deterministic=True)


def raised(error):
    """An op that raises `error` (an InvalidArgumentError) unless it is empty."""
    # The raw op: `tf.debugging.Assert` wraps it in a `cond`, one more
    # function for every iterator to instantiate.
    return tf.raw_ops.Assert(condition=tf.equal(error, ""), data=[error], summarize=1)


def without_pads(batches):
    """Batches `(batch, places)` without the places of record id -1 that
    padded their epoch (see `stored_batches`)."""

    def drop(inputs, place):
        keep = place[1] >= 0
        return tf.cond(
            tf.reduce_all(keep),
            lambda: (inputs, place),
            lambda: tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), (inputs, place)),
        )

    return batches.map(drop)


def _raising(records):
    """Batches of records that raise their error here, without it."""

    def check(records, segments, indices, place, error):
        with tf.control_dependencies([raised(error)]):
            return tf.identity(records), segments, indices, place

    return records.map(check)


def stored_batches(plan, state, store, then=None, running=False, pad=False):
    """Batches `(batch, places)` gathered from the complete decoded cache
    `store`, in the stream's order; with `then`, `then(batch)` alone, in
    the same function (each function costs every iterator its
    instantiation). With `running`, epochs in sequence (see `epochs.Running`);
    with `pad` too, each epoch ends on a whole batch, filled with places
    of record id -1 (any record's example: see `without_pads`), so that
    its examples, batched again one at a time (a per-example `augment`),
    keep to their epoch's batches."""

    def get(epochs, ids, errors):
        with tf.control_dependencies([raised(errors[0])]):
            if then is not None:
                return then(store.get(ids))
            return store.get(tf.maximum(ids, 0) if pad else ids), (epochs, ids)

    places = _places(plan, state, running, pad)
    return places.map(get, num_parallel_calls=AUTOTUNE, deterministic=True)


def with_store(decoded, plan, state, store):
    """Decoded batches `(batch, places)` through the decoded cache `store`:
    an iterator that starts once every record is in gathers its batches
    from the store; before that, the decoded batches go in as they pass.
    The choice is made as an iterator starts, before it claims its epoch."""
    filling = decoded.map(lambda batch, place: (store.put(batch, place[1]), place))
    stored = stored_batches(plan, state, store)
    choice = tf.data.Dataset.from_tensors(0).flat_map(
        lambda _: tf.data.Dataset.from_tensors(tf.cast(store.complete(), tf.int64)).repeat()
    )
    # (Both branches' iterators are made with each iterator: making the
    # filling one lazily, behind a flat_map, stalled the next epoch's first
    # batch for a second now and then, while the old iterator went.)
    return tf.data.Dataset.choose_from_datasets(
        [filling, stored], choice, stop_on_empty_dataset=True
    )


def _decoder(plan, seed):
    """`decode(carried)`: one carried record decoded, its crop window (with
    `random_resized_crop`) drawn from `(seed, epoch, record id)`."""
    meta, options = plan.meta, plan.options

    def decode(carried):
        window_seed = None
        if options.random_resized_crop is not None:
            window_seed = crop.seed_of(seed, carried["epoch"], carried["id"])
        return decoding.decode_example(carried["record"], meta, options, window_seed)

    return decode


def decoded_examples(records, plan, then, seed):
    """Batches of records -> decoded examples, each `(example, place)`,
    one at a time, in order; each decode guarded as on the other path (a
    failing example raises naming it, or is skipped and counted).

    Skipping (the default) runs on the stream of examples as it is: the
    errors of the reading before the decode came as values, so the guard
    cannot drop them, and they are raised after it. Naming a failing
    example, or checking a datum export's labels, runs on blocks of a
    batch each (`read_guard.in_blocks`). `seed`: the stream's, which
    the crop windows are drawn from."""
    meta = plan.meta
    if plan.on_invalid != "raise" and not meta.in_place:
        return _skipping(records, plan, then, seed)
    decoder = _decoder(plan, seed)

    def decode(carried):
        # A dict: the guard maps over it as one argument.
        return then(decoder(carried)), (carried["epoch"], carried["id"])

    elements = _raising(records).map(
        lambda record, segment, index, place: (record, segment, index, *place)
    )
    if meta.in_place:
        elements = read_guard.labels_checked(elements.unbatch(), meta.json).batch(plan.batch_size)
    packed = elements.map(
        lambda record, segment, index, epoch, record_id: (
            {"record": record, "epoch": epoch, "id": record_id}, segment, index
        )
    )
    if plan.on_invalid == "raise":
        paths = list(plan.table.paths())

        def guard(examples, number):
            return read_guard.naming_decode(examples, decode, paths, plan.split)
    else:
        packed = packed.map(lambda carried, segment, index: carried)

        def guard(examples, number):
            return read_guard.skipping_decode(examples, decode, plan.split, False, False, number)

    return read_guard.in_blocks(packed, guard, plan.batch_size)


def _skipping(records, plan, then, seed):
    """`decoded_examples` skipping what fails to decode, on the stream of
    examples (no blocks): the first batch waits for its own decodes. An
    epoch ends with a marker, so that a skipped last example is counted."""
    decoder = _decoder(plan, seed)

    def decode(carried):
        # An example whose batch was not read (or the end marker) decodes
        # to nothing; the error is raised once past the guard. (The decode
        # is traced once: the empty branch, traced after it, takes its spec.)
        traced = {}

        def read():
            example = then(decoder(carried))
            traced["spec"] = tf.nest.map_structure(tf.TensorSpec.from_tensor, example)
            return example

        example = tf.cond(
            tf.equal(carried["error"], "") & tf.logical_not(carried["end"]), read,
            lambda: read_guard.empty_like(traced["spec"]),
        )
        return example, (carried["epoch"], carried["id"]), carried["error"], carried["end"]

    def spread(records, segments, indices, place, error):
        return {"record": records, "epoch": place[0], "id": place[1],
                "error": tf.fill(tf.shape(records), error),
                "end": tf.zeros(tf.shape(records), tf.bool)}

    examples = records.map(spread).unbatch()
    if not plan.repeat:
        zero = tf.constant(0, tf.int64)
        examples = examples.concatenate(tf.data.Dataset.from_tensors(
            {"record": tf.constant(b""), "epoch": zero, "id": zero, "error": tf.constant(""),
             "end": tf.constant(True)}
        ))
    decoded = read_guard.skipping_decode(examples, decode, plan.split)

    def check(example, place, error, end):
        with tf.control_dependencies([raised(error)]):
            return tf.nest.map_structure(tf.identity, example), place

    return decoded.filter(lambda example, place, error, end: tf.logical_not(end)).map(check)


def decoded_batches(records, decode_batch, then):
    """Batches of raw-pixel records decoded whole (`blocks.batch_decode`):
    `(batch, places)`, nothing per example."""
    return _raising(records).map(
        lambda batch, segments, indices, place: (then(decode_batch(batch)), place),
        num_parallel_calls=AUTOTUNE, deterministic=True,
    )
