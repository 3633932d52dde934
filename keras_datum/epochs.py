"""A stream's epochs as `model.fit` reads them: `Epochs`, the dataset
whose iterators each hand out one epoch, with the epoch's batch count as
its cardinality; and `Running`, the epochs that follow each other read
from one `tf.data` iterator kept across them, handed out by a view per
epoch (`_EpochView`). The stages themselves are in `streams`.
"""

import threading
import time
import weakref
from typing import Any
from typing import NamedTuple

import tensorflow as tf

from keras_datum import store

# How often a thread waiting for the decoded cache to be complete looks.
_WATCH_S = 0.02
# How long after that it waits for the iterator that filled it to go.
_GRACE_S = 0.1


class Epochs(tf.data.Dataset):
    """A stream whose iterators each hand out one epoch (or, repeating, run
    on without end), with `steps` batches per epoch as its cardinality.

    `tf.data`'s own count (`assert_cardinality`) would fail the shorter
    first epoch of a resumed stream; Keras takes the count from here and
    ends that epoch when the data does (see `callbacks.BackupAndRestore`).

    With the decoded cache, an eager iterator (`iter()`, as `model.fit`
    makes one per epoch) of a complete store builds no decoding pipeline:
    `running` (a `Running`, for streams that end each epoch) serves it
    one epoch of an iterator kept across epochs, and `stored` (`(dataset,
    store)`, for repeating ones) is the stream gathered from the store
    alone. Everything else (a restored mid-epoch position, a
    distribution strategy's iterators, datasets made from this one) goes
    through `dataset`, which chooses between decoding and the store in
    the graph.
    """

    def __init__(self, dataset, steps, state, stored=None, running=None):
        self._dataset = dataset
        self._steps = steps
        self._stored = stored
        self._running = running
        self.stream_state = state
        super().__init__(dataset._variant_tensor)

    def __iter__(self):
        if not tf.executing_eagerly():
            return super().__iter__()
        if self._running is not None:
            view = self._running.view()
            if view is not None:
                return view
        if self._stored is not None:
            dataset, store = self._stored
            if bool(store.complete()):
                return iter(dataset)
        iterator = super().__iter__()
        if self._running is not None:
            self._running.prepare_after(iterator)
        return iterator

    def _inputs(self):
        return [self._dataset]

    @property
    def element_spec(self):
        return self._dataset.element_spec

    def cardinality(self):
        return tf.constant(self._steps, tf.int64)


class _Kept(NamedTuple):
    """A `Running`'s iterator, handed back at the end of an epoch (or made
    ahead by `Running.prepare_after`): the epoch it goes on with, its seed,
    and (after an epoch left short, or made ahead) that epoch's first
    batch, taken already."""

    iterator: Any
    epoch: int
    seed: int
    pending: Any = None


class Claims:
    """Where a `Running`'s iterators claim their start: from its stream's
    state, or (the one `Running.prepare_after` makes ahead) a start reserved for
    it, which leaves the state alone: the view that serves that iterator
    claims the state as it hands out its first batch."""

    def __init__(self, state):
        self._state = state
        self._reserved = None
        self._lock = threading.Lock()

    def reserve(self, start):
        """The next claim is `start`, `(epoch, offset, seed)` (or, with
        None, the state's again)."""
        with self._lock:
            self._reserved = start

    def claim(self):
        with self._lock:
            start, self._reserved = self._reserved, None
        return self._state.claim() if start is None else start


class Running:
    """A stream's epochs read in sequence from one iterator kept across
    them, for eager iterators (see `Epochs`): an epoch that follows the
    last one read makes no `tf.data` iterator, whose functions tf.data
    would instantiate again (about 2 ms each), and its first batches were
    made while the last one ended (the prefetch).

    `dataset`'s epochs follow each other from the position its iterator
    claims (`streams._places` with `running`), each exactly `steps_per_epoch`
    batches, and a view hands out that many. A decoding stream (no
    cache) decodes each batch of records into a batch of its own, which
    skipped examples leave shorter, and a batch whose examples were all
    skipped leaves its epoch short: `with_epochs`, its elements are
    `(batch, epoch)`, and a view ends its epoch at the next one's first
    batch, which it keeps for the next view. A view serves
    the state's next position when it is the start of the epoch after
    the one the kept iterator has handed out whole, with the same seed;
    anything else (a restored position, an epoch left unfinished, a
    store being filled, a cache exported over) gets a new iterator, or
    none (`view` returns None) where the stream's own must run.
    """

    def __init__(self, dataset, state, num_examples, batch_size, store=None, guard=None,
                 with_epochs=False, claims=None):
        self.dataset = dataset
        self._state = state
        self._steps = -(-num_examples // batch_size)
        self._store = store
        self._guard = guard
        self.with_epochs = with_epochs
        self._claims = claims
        self._kept = None
        self._lock = threading.Lock()
        self._building = threading.Lock()  # Held while `_prepare` makes one.
        self._views = 0  # Views made: one made first cancels a preparation.

    def view(self):
        """An iterator over the state's next epoch, or None."""
        with self._building:
            self._views += 1
        position, seed = self._state.next_position, self._state.seed
        with self._lock:
            kept, self._kept = self._kept, None
        if not self._serves(position):
            return None
        if kept is not None and (kept.epoch, kept.seed) == (position.epoch, seed):
            # Claimed by the view's first batch, as a new iterator claims.
            return _EpochView(self, kept.iterator, position.epoch, seed, self._state.claim,
                              kept.pending)
        # A new iterator claims the position itself.
        return _EpochView(self, iter(self.dataset), position.epoch, seed)

    def _serves(self, position):
        """Whether a view may serve `position` (else the stream's own
        iterator runs)."""
        if position.offset or not self._steps:
            return False
        if self._store is not None and not bool(self._store.complete()):
            return False
        return self._guard is None or store.still_the_export(self._guard)

    def prepare_after(self, iterator):
        """Makes the kept iterator of the epoch after the one `iterator`
        (the stream's own: it fills the cache, or reads a restored
        position) reads, with that epoch's first batch, ahead, in a thread:
        once the cache is complete and `iterator` is gone (its last batch
        read), or `_GRACE_S` after (an iterator kept, as Keras keeps an
        epoch's until the next one starts). The next epoch's view serves
        it, instead of making it then (about 40 ms on a later epoch of
        1,600 small images, which lasts 10), when validation or anything
        else ran between the epochs; a view asked for first makes its own,
        as before. The thread gives up once `iterator` is gone without a
        complete cache, or as the interpreter exits."""
        if self._claims is None or self._store is None or self._kept is not None:
            return
        alive = weakref.ref(iterator)
        threading.Thread(target=self._prepare_once_complete, args=(alive, self._views),
                         name="keras_datum-prepare").start()

    def _prepare_once_complete(self, alive, views):
        main = threading.main_thread()
        # Complete before the iterator's last batch: looked at once more after.
        while not bool(self._store.complete()):
            if alive() is None or not main.is_alive():
                return
            time.sleep(_WATCH_S)
        # Not alongside the epoch's last batches: made while they are read,
        # it slowed the epochs read back to back after it.
        deadline = time.monotonic() + _GRACE_S
        while alive() is not None and time.monotonic() < deadline:
            if not main.is_alive():
                return
            time.sleep(_WATCH_S)
        with self._building:
            if self._views == views:
                self._prepare()

    def _prepare(self):
        position, seed = self._state.next_position, self._state.seed
        if self._kept is not None or not self._serves(position):
            return
        # Its pipeline claims the reserved start as it makes the first batch.
        self._claims.reserve((position.epoch, 0, seed))
        try:
            iterator = iter(self.dataset)
            pending = next(iterator)
        except (tf.errors.OpError, StopIteration):  # The view makes its own, which raises.
            return
        finally:
            self._claims.reserve(None)
        with self._lock:
            if self._kept is None:
                self._kept = _Kept(iterator, position.epoch, seed, pending)

    def _give_back(self, iterator, epoch, seed, pending=None):
        with self._lock:
            self._kept = _Kept(iterator, epoch + 1, seed, pending)


def one_epoch_of(kept, steps):
    """A decoding `Running` stream's dataset (elements `(batch, epoch)`)
    read as one epoch: the batches of the epoch its iterator claims, at
    most `steps` (an epoch restored mid-way, or left short by a batch
    skipped whole, ends at the next epoch's first batch)."""

    def same(first, element):
        batch, epoch = element
        first = tf.where(first < 0, epoch, first)
        return first, (batch, tf.equal(epoch, first))

    def epoch(_):
        return (
            kept.scan(tf.constant(-1, tf.int64), same)
            .take_while(lambda batch, same: same)
            .take(steps)
            .map(lambda batch, same: batch)
        )

    # Inside a function: a `scan` built at the top level leaves a function
    # in TensorFlow's global graph for good, per build.
    return tf.data.Dataset.from_tensors(0).flat_map(epoch)


class _EpochView:
    """One epoch's batches from a `Running`'s kept iterator; it hands the
    iterator back once the whole epoch is read."""

    def __init__(self, running, iterator, epoch, seed, claim=None, pending=None):
        self._running = running
        self._iterator = iterator
        self._epoch = epoch
        self._seed = seed
        self._claim = claim
        self._pending = pending  # The next epoch's first batch, taken early.
        self._left = running._steps
        self._iters = 0

    def __iter__(self):
        self._iters += 1
        return self

    def __next__(self):
        if not self._left:
            raise StopIteration
        if self._claim is not None:
            self._claim, claim = None, self._claim
            claim()
        batch, self._pending = self._pending or next(self._iterator), None
        if self._running.with_epochs:
            if int(batch[1]) != self._epoch:
                return self._short(batch)
            batch = batch[0]
        self._left -= 1
        if not self._left:
            self._running._give_back(self._iterator, self._epoch, self._seed)
        return batch

    def _short(self, next_batch):
        """Ends an epoch whose last batch had every example skipped (see
        `Running`), keeping the next epoch's first batch for its view.
        Keras's TensorFlow trainer takes each step's batch from `zip(range(
        steps), iterator)`, calling `iter()` on this view every step, and
        a `StopIteration` there leaves the step with no batch at all: that
        consumer is told the end as a `tf.data` iterator tells it."""
        self._left = 0
        self._running._give_back(self._iterator, self._epoch, self._seed, next_batch)
        if self._iters > 1:
            raise tf.errors.OutOfRangeError(None, None, "End of sequence")
        raise StopIteration

    def get_next(self):
        """The next batch; `tf.errors.OutOfRangeError` at the epoch's end,
        as a `tf.data` iterator's."""
        try:
            return next(self)
        except StopIteration:
            raise tf.errors.OutOfRangeError(None, None, "End of sequence") from None

    @property
    def element_spec(self):
        spec = self._iterator.element_spec
        return spec[0] if self._running.with_epochs else spec
