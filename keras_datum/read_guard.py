"""The read path's guard: an example whose image fails to decode, although
the export checked it (a shard damaged since, another machine's decoder),
is named (`on_invalid="raise"`) or skipped and counted (`"skip"`), never a
bare TensorFlow error in some epoch.

The guard drops a failing example with `ignore_errors` and finds it by the
gap it leaves in a numbered stream (the decode keeps the order). It runs on
blocks of examples in turn (`in_blocks`), so that its `ignore_errors` sees
only their decodes, never an error of the reading before them.
"""

import os
import sys
import warnings

import tensorflow as tf

from keras_datum import datum_format
from keras_datum import py_calls

AUTOTUNE = tf.data.AUTOTUNE


_NAME_SPEC = {"source/filename": tf.io.FixedLenFeature([], tf.string, default_value="")}


def _place_message(paths, shard, record):
    """Names a record: its shard, its index there and its source file (read
    from the shard: only when an example fails, so no step per example)."""
    path = tf.gather(tf.constant(paths, tf.string), shard)
    serialized = tf.data.TFRecordDataset(path).skip(record).take(1).get_single_element()
    name = tf.io.parse_single_example(serialized, _NAME_SPEC)["source/filename"]
    return tf.strings.join(
        ["record ", tf.strings.as_string(record), " of shard ", path, " (source file ",
         name, ")"]
    )


def _warn_skipped(message):
    # From a tf.data thread: no caller of the user's to point to.
    warnings.warn(message.numpy().decode("utf-8", "backslashreplace"), RuntimeWarning,
                  stacklevel=1)
    return 0


def _report_skipped(service):
    """How a skipped example is reported: a Python warning, or (on tf.data
    service workers, which run no Python) a line on standard error."""

    warn = py_calls.calls(_warn_skipped, lambda message: 0)

    def report(message):
        if service:
            tf.print(message, output_stream=sys.stderr)
            return tf.constant(0)
        return tf.py_function(warn, [message], tf.int32)

    return report


def labels_checked(dataset, meta):
    """A datum export's records, each parsed once as they stream by, so that
    its label checks (`datum_format.parse_example`: no export validated them)
    stop the read before the guard, which would take such an error for an
    image that does not decode. The records pass on unparsed (the first
    component of each element, when it carries its place)."""

    def check(record, *place):
        parsed = datum_format.parse_example(record, meta)
        with tf.control_dependencies(tf.nest.flatten(parsed)):
            record = tf.identity(record)
        return (record, *place) if place else record

    return dataset.map(check, num_parallel_calls=AUTOTUNE, deterministic=True)


# Examples decoded under one guard at a time (see `in_blocks`).
GUARD_BLOCK = 128
# Decodes of a block in parallel: as many as cores. A block's pipeline lives
# for 128 examples, too short for AUTOTUNE to ramp its parallelism up
# (first epochs ran about 10% longer with it, benchmarks/ab.py).
_BLOCK_PARALLELISM = os.cpu_count() or 1


def in_blocks(dataset, guard, block=None):
    """`guard(examples, number)` (decodes examples, dropping those that fail)
    run on blocks of `dataset`'s elements in turn, keeping their order:
    blocks of `GUARD_BLOCK` elements, or, with `block`, the elements of
    `dataset` are blocks already, of at most `block` examples.

    The guard's `ignore_errors` then sees only the decodes of its block:
    an error of the reading before them (a missing or damaged shard, a
    cache exported over, a datum export's label) stops the read as it is,
    instead of being dropped with the element it came with.
    """
    blocks = (dataset.batch(GUARD_BLOCK) if block is None else dataset).enumerate()
    return blocks.interleave(
        lambda number, block: guard(tf.data.Dataset.from_tensor_slices(block), number),
        cycle_length=2, block_length=block or GUARD_BLOCK, num_parallel_calls=2,
        deterministic=True,
    )


def empty_like(spec):
    """A value of the structure `spec` describes, empty where a size is unknown."""
    return tf.nest.map_structure(
        lambda s: tf.zeros([0 if d is None else d for d in s.shape], s.dtype), spec
    )


def _placeholder(decode, example):
    """A function giving an element of `decode`'s structure (empty where a
    size is unknown): what the end marker of `naming_decode` decodes to."""
    spec = tf.data.Dataset.from_tensors(example).map(decode).element_spec
    return lambda: empty_like(spec)


def _numbered(examples, decode, finite):
    """`(record, shard, index)` elements -> `(number, is_end, place of the
    element before, decoded)`, in order; a `finite` stream gets an end
    marker. An element that fails to decode is dropped."""
    nothing = empty_like(examples.element_spec[0])
    placeholder = _placeholder(decode, nothing)
    marked = examples.map(lambda record, shard, index: (record, shard, index, False))
    if finite:
        zero = tf.constant(0, tf.int64)
        marked = marked.concatenate(tf.data.Dataset.from_tensors((nothing, zero, zero, True)))

    def number(state, element):
        record, shard, index, is_end = element
        return (state[0] + 1, shard, index), (state[0], record, is_end, state[1:])

    # The first element's "before" is its own place: a gap can first show
    # at the second element, naming the first.
    first = examples.take(1).get_single_element()
    start = (tf.constant(0, tf.int64), first[1], first[2])
    return marked.scan(start, number).map(
        lambda count, record, is_end, before: (
            count, is_end, before, tf.cond(is_end, placeholder, lambda: decode(record))
        ),
        num_parallel_calls=_BLOCK_PARALLELISM, deterministic=True,
    ).ignore_errors()


def skipping_decode(records, decode, split, service=False, quiet=False, block=0):
    """Decodes serialized `records` with `decode`, skipping and counting the
    examples that fail although the export checked them (on_invalid="skip").

    The failing ones are dropped (`ignore_errors`) and counted from the
    gaps in the numbered stream (the decode keeps the order): a warning
    gives the count so far at each. Cheaper than `naming_decode` (one
    step per example besides the decode, no place carried): this is the
    default. A second pass (`quiet`), which fills the places of skipped
    examples, says once that it does.
    """
    report = _report_skipped(service)
    numbered = records.enumerate().map(
        lambda count, record: (count, decode(record)),
        num_parallel_calls=_BLOCK_PARALLELISM, deterministic=True,
    ).ignore_errors()

    quiet = tf.constant(quiet) if quiet is False else quiet
    first_block = tf.equal(block, 0)
    second_pass = tf.constant(f"Examples of the {split} split that do not decode were skipped "
                              "in this epoch (the warnings before this one count those that "
                              "others followed); their places go to examples of another pass.")

    def check(state, element):
        expected, skipped = state
        count, decoded = element
        gap = count - expected
        skipped += gap

        def say():
            so_far = tf.strings.join([(f"Skipped examples of the {split} split that do not "
                                      "decode: "), tf.strings.as_string(gap), " (",
                                      tf.strings.as_string(skipped), " in this block of ",
                                      str(GUARD_BLOCK), ")."])
            return report(tf.where(quiet, second_pass, so_far))

        # A second pass says so at its start.
        speak = tf.where(quiet, first_block & tf.equal(expected, 0), gap > 0)
        done = tf.cond(speak, say, lambda: tf.constant(0))
        with tf.control_dependencies([done]):
            decoded = tf.nest.map_structure(tf.identity, decoded)
        return (count + 1, skipped), decoded

    return numbered.scan((tf.constant(0, tf.int64),) * 2, check)


def naming_decode(examples, decode, paths, split):
    """Decodes `(record, shard index, index in shard)` elements with `decode`
    (on_invalid="raise"), stopping at an example that fails to decode
    although the export checked it with an `InvalidArgumentError` naming
    its shard, its record and its source file.

    Each element carries the place of the one before it, which names the
    one that failed; an end marker names a failing last example.
    """

    def failed(place, ok):
        message = tf.strings.join(
            [f"An example of the {split} split does not decode: ", place, (". It passed "
             "the export check, so the shard was damaged since, or TensorFlow decodes "
             "differently on this machine. Export again (reexport=always), or pass "
             "on_invalid=skip to leave such examples out.")])
        with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
            return tf.constant(0)

    def check(expected, element):
        count, is_end, (shard, index), decoded = element
        # One branch per element; the rare one reads the shard to name it.
        done = tf.cond(count > expected,
                       lambda: failed(_place_message(paths, shard, index), count <= expected),
                       lambda: tf.constant(0))
        with tf.control_dependencies([done]):
            return count + 1, (is_end, decoded)

    numbered = _numbered(examples, decode, finite=True)
    checked = numbered.scan(tf.constant(0, tf.int64), check)
    return checked.filter(lambda is_end, _: tf.logical_not(is_end)).map(lambda _, d: d)
