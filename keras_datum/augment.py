"""Keras and KerasCV preprocessing layers, before and after batching.

Inside the pipeline an element is the KerasCV dict (`{"images": ...,
"labels": ...}`); both `keras.layers.*` and `keras_cv.layers.*` preprocessing
layers take and return that dict. A callable given to `augment=` gets the same
dict and must return one. The dict becomes `(x, y)` only at the very end.
"""

import collections
import contextlib
import dataclasses
import random

import keras
import numpy as np
import tensorflow as tf

from keras_datum import notices

# Layers that mix the labels of two examples: they need float one-hot labels.
LABEL_MIXING_LAYERS = ("MixUp", "CutMix", "FourierMix")
# Random ops that draw from TensorFlow's global random state (an op seed
# fixed when the function is traced), not from a generator that `reseed`
# can restart: `tf.random.uniform`, `gamma`, `shuffle` and the like without
# a generator. Keras's and `tf.random.Generator`'s ops are not among them.
GLOBAL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "RandomCrop", "Multinomial",
})
# Ops that advance state kept outside the function (a variable, a
# `tf.random.Generator`): in a layer, `reseed` restarts its generators; in a
# plain function (one wrapping a layer, say), nothing can.
STATE_OPS = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "RngReadAndSkip",
    "RngSkip", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal",
})


class Augmentation:
    """An ordered list of augmentation steps, checked when it is built.

    Args:
        steps: a layer, a callable, or a list/tuple of them, applied in order.
        argument: the argument's name, for error messages.
    """

    def __init__(self, steps, argument):
        if not isinstance(steps, (list, tuple)):
            steps = [steps]
        for step in steps:
            if not callable(step):
                raise TypeError(
                    f"`{argument}` must be a Keras layer, a callable, or a list "
                    f"of them. Received: {argument}={step!r} "
                    f"(of type {type(step).__name__})"
                )
        self.steps = list(steps)
        self.argument = argument
        self.seed = None
        self._pending = []

    @property
    def layers(self):
        """The layers the problems' checks look at (see `outer_layers`)."""
        return [layer for step in self.steps for layer in outer_layers(step)]

    @property
    def mixes_labels(self):
        return [_name(s) for s in self.steps if type(s).__name__ in LABEL_MIXING_LAYERS]

    def reseed(self, seed):
        """Restarts every random generator of the steps from `seed`.

        Keras layers keep `keras.random.SeedGenerator`s, KerasCV layers a
        `tf.random.Generator`; both advance as they are used. Restarting them
        makes a seeded stream repeat exactly on every `train()` call. Steps
        that draw from TensorFlow's global random state instead are named in
        a warning when the pipeline traces them (see `__call__`).
        """
        self.seed = seed
        offset = 0
        for step in self.steps:
            if not isinstance(step, keras.layers.Layer):
                continue
            for layer in step._flatten_layers(include_self=True):
                for generator in _generators(layer):
                    offset += 1
                    if isinstance(generator, tf.random.Generator):
                        generator.reset_from_seed(seed + offset)
                    else:
                        generator.state.assign(
                            tf.cast([seed + offset, 0], generator.state.dtype)
                        )

    def __call__(self, inputs):
        # Traced with a seed, each step's new global random ops (and, for a
        # plain function, its state ops) are counted in the function being
        # built, so that a step the seed cannot make repeat is named instead
        # of silently changing from call to call. Python's and NumPy's global
        # generators, which a layer may draw from while it is traced (Keras's
        # AugMix picks its operations so), are seeded for each step's trace
        # and then put back as they were.
        counting = self.seed is not None and not tf.executing_eagerly()
        graph = tf.compat.v1.get_default_graph()
        before = _ops(graph) if counting else None
        unseeded = []
        for index, step in enumerate(self.steps):
            if not counting:
                inputs = _apply(step, inputs, self.argument)
                continue
            with _seeded_host_generators(self.seed + index):
                inputs = _apply(step, inputs, self.argument)
            after = _ops(graph)
            new = after - before
            found = sorted(op for op in new if op in GLOBAL_RANDOM_OPS)
            if not isinstance(step, keras.layers.Layer):
                found += sorted(op for op in new if op in STATE_OPS)
            if found:
                unseeded.append(f"{_name(step)} ({', '.join(found)})")
            before = after
        message = (
            f"With seed={self.seed}, these {self.argument} steps still draw from "
            f"TensorFlow's global random state or keep state of their own, which "
            f"the seed cannot restart, so their augmented stream differs from "
            f"call to call: {'; '.join(unseeded)}. keras.layers.RandomFlip, MixUp, "
            "CutMix and RandAugment repeat with a seed; pass layers themselves "
            "(not a function that calls them) so that the seed restarts them. "
            "Global random ops repeat once keras.utils.set_random_seed has been "
            "called."
        )
        # A pipeline can trace the steps twice (see `pipeline._stream`): once said.
        if unseeded and message not in self._pending:
            self._pending.append(message)
        return inputs

    def seeded(self, inputs, epoch, key):
        """The steps on `inputs` with every random generator of theirs set
        first from `(seed, epoch, key)` alone (in the traced function, before
        the steps draw): what one example gets (`key` its record; for a
        batch, its first record's) no longer depends on what came before it,
        so that a stream resumed mid-epoch repeats (see `streams`)."""
        assigns = [
            _set_generator(generator, self.seed + offset, epoch, key)
            for offset, generator in enumerate(self._graph_generators(), 1)
        ]
        with tf.control_dependencies(assigns):
            inputs = tf.nest.map_structure(tf.identity, inputs)
        return self(inputs)

    def _graph_generators(self):
        """The generators the steps draw from in a `tf.data` function. A
        Keras data layer on another backend draws from a TensorFlow one it
        makes on first use there: made here, as the layer would."""
        found = []
        for step in self.steps:
            if not isinstance(step, keras.layers.Layer):
                continue
            for layer in step._flatten_layers(include_self=True):
                if keras.backend.backend() != "tensorflow" and hasattr(
                    layer, "_get_seed_generator"
                ) and hasattr(layer, "generator"):
                    layer.backend.set_backend("tensorflow")
                    try:
                        layer._get_seed_generator("tensorflow")
                    finally:
                        layer.backend.reset()
                found.extend(
                    g for g in _generators(layer)
                    if _in_tensorflow(g) and all(g is not f for f in found)
                )
        return found

    def warn_pending(self, warn=True):
        """Warns what tracing found, from the caller's line (a warning raised
        while tracing would name autograph's generated file instead); with
        `warn=False` (a seed drawn from the global seed, which seeds the
        global random ops itself), drops it."""
        for message in self._pending if warn else ():
            notices.warn(message)
        self._pending = []


@contextlib.contextmanager
def _seeded_host_generators(seed):
    python_state, numpy_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _ops(graph):
    """Counts of the `STATE_OPS` and unseeded `GLOBAL_RANDOM_OPS` in `graph`
    and the functions it holds. A random op with a seed (its own, or from
    `tf.random.set_seed` or `keras.utils.set_random_seed`, which set one when
    it is traced) repeats."""
    definition = graph.as_graph_def()
    nodes = list(definition.node)
    for function in definition.library.function:
        nodes.extend(function.node_def)
    return collections.Counter(
        n.op for n in nodes
        if n.op in STATE_OPS
        or (n.op in GLOBAL_RANDOM_OPS and not (n.attr["seed"].i or n.attr["seed2"].i))
    )


def _in_tensorflow(generator):
    """Whether `generator` keeps its state in TensorFlow (a layer's own
    generator on another backend is not the one it draws from in tf.data)."""
    if isinstance(generator, tf.random.Generator):
        return True
    return isinstance(getattr(generator.state, "value", None), tf.Variable)


def _set_generator(generator, seed, epoch, key):
    """Assigns `generator` a state made from `(seed, epoch, key)` alone."""
    epoch, key = tf.cast(epoch, tf.int64), tf.cast(key, tf.int64)
    high = (seed * 1000003 + epoch) % 2**31
    low = (key * 4096) % 2**31
    if isinstance(generator, tf.random.Generator):
        return generator.state.assign(tf.cast(tf.stack([low, high, seed % 2**31]),
                                              generator.state.dtype))
    return generator.state.assign(tf.cast(tf.stack([high, low]), generator.state.dtype))


def _generators(layer):
    found = []
    for value in vars(layer).values():
        if isinstance(value, dict):  # A data layer's generators on other backends.
            value = list(value.values())
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, (keras.random.SeedGenerator, tf.random.Generator)) and all(
                item is not f for f in found
            ):
                found.append(item)
    return found


def image_layer_bases():
    """The base classes of Keras's image preprocessing layers, of KerasCV's,
    and of KerasCV's vectorized ones (None for KerasCV's where it is not
    installed)."""
    from keras.src.layers.preprocessing.image_preprocessing import (
        base_image_preprocessing_layer as keras_base,
    )

    try:
        from keras_cv.layers import BaseImageAugmentationLayer
        from keras_cv.layers import VectorizedBaseImageAugmentationLayer
    except ImportError:
        return keras_base.BaseImagePreprocessingLayer, None, None
    return (
        keras_base.BaseImagePreprocessingLayer,
        BaseImageAugmentationLayer,
        VectorizedBaseImageAugmentationLayer,
    )


def image_layer_family(step):
    """"keras" for Keras's image preprocessing layers (subclasses too),
    "keras_cv" for KerasCV's, None for anything else."""
    keras_base, keras_cv_base, keras_cv_vectorized = image_layer_bases()
    if isinstance(step, keras_base):
        return "keras"
    if keras_cv_base is not None and isinstance(step, (keras_cv_base, keras_cv_vectorized)):
        return "keras_cv"
    return None


def is_image_layer(step):
    """Whether `step` is one of Keras's or KerasCV's image preprocessing layers."""
    return image_layer_family(step) is not None


def outer_layers(step):
    """The layers a step's checks look at: an image layer itself (its own
    inner layers are its business); the layers a container holds
    (`keras.layers.Pipeline`, a `Sequential`), likewise; another layer
    itself; nothing for a plain callable, which owns the dict."""
    if not isinstance(step, keras.layers.Layer):
        return []
    if is_image_layer(step):
        return [step]
    inner = [
        layer for layer in step._flatten_layers(include_self=False, recursive=False)
        if not isinstance(layer, keras.layers.InputLayer)  # A Sequential's input.
    ]
    return [layer for sub in inner for layer in outer_layers(sub)] if inner else [step]


def _name(step):
    if isinstance(step, keras.layers.Layer):
        return f"{type(step).__name__} (name={step.name!r})"
    return getattr(step, "__name__", type(step).__name__)


def _structure(inputs):
    return tf.nest.map_structure(lambda v: (v.dtype.name, v.shape.rank), inputs)


def _as_batch_of_one(step, inputs):
    """Whether `step` gets this example as a batch of one: Keras's layers
    on its JAX and PyTorch backends fail on one example's boxes inside
    tf.data (Keras 3.15 formats a single example's boxes with the backend's
    own ops, not TensorFlow's), and take a batch of one the same way."""
    return (
        keras.backend.backend() != "tensorflow"
        and "images" in inputs
        and inputs["images"].shape.rank == 3
        and any(image_layer_family(layer) == "keras" for layer in outer_layers(step))
    )


def _apply(step, inputs, argument):
    one = _as_batch_of_one(step, inputs)
    try:
        if one:
            outputs = step(tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), dict(inputs)))
            outputs = tf.nest.map_structure(lambda t: tf.squeeze(t, 0), outputs)
        else:
            outputs = step(dict(inputs))
    except Exception as e:
        raise ValueError(
            f"The {argument} step {_name(step)} failed on the element "
            f"{_structure(inputs)}: {type(e).__name__}: {e}"
        ) from e
    if not isinstance(outputs, dict) or set(outputs) != set(inputs):
        shown = _structure(outputs) if isinstance(outputs, dict) else type(outputs).__name__
        raise ValueError(
            f"The {argument} step {_name(step)} must return the element dict "
            f"with keys {sorted(inputs)}; it returned {shown}."
        )
    if "images" in inputs and outputs["images"].shape.rank != inputs["images"].shape.rank:
        raise ValueError(
            f"The {argument} step {_name(step)} changed the rank of 'images' "
            f"from {inputs['images'].shape.rank} to {outputs['images'].shape.rank}."
        )
    return outputs


def resolve(augment, batch_augment, pre_batching_callback, post_batching_callback,
            batched=True):
    """Builds the (per-example, per-batch) augmentations from `train()` arguments.

    `pre_batching_callback` / `post_batching_callback` are datum's names for
    `augment` / `batch_augment`. A per-batch one needs `batched` examples.
    """
    pairs = (
        ("augment", augment, "pre_batching_callback", pre_batching_callback),
        ("batch_augment", batch_augment, "post_batching_callback", post_batching_callback),
    )
    built = []
    for name, value, alias, alias_value in pairs:
        if value is not None and alias_value is not None:
            raise ValueError(f"Pass `{name}` or its alias `{alias}`, not both.")
        value = value if value is not None else alias_value
        built.append(None if value is None else Augmentation(value, name))
    if not batched and built[1] is not None:
        raise ValueError(
            "`batch_augment` (or `post_batching_callback`) works on batches, "
            "but `batch_size` is None: the examples are not batched. Pass a "
            "batch_size, or use `augment` for per-example layers."
        )
    return tuple(built)


def label_mode_for(augmentations, label_mode, label_spec, preview=False):
    """Switches integer labels to one-hot for layers that mix labels, and says
    so, unless for a `preview` (its switch is its own: nothing to compile)."""
    mixing = [n for a in augmentations if a is not None for n in a.mixes_labels]
    if not mixing or label_spec["type"] != "class" or label_mode != "int":
        return label_mode
    if preview:
        return "categorical"
    notices.warn(
        f"{', '.join(mixing)} mixes labels, so it needs one-hot float labels: "
        "label_mode is switched from 'int' to 'categorical' for this dataset. "
        "Compile the model with a categorical loss (for example "
        "'categorical_crossentropy'), or pass label_mode='categorical' to "
        "silence this warning.",
    )
    return "categorical"


def read_options_for_split(read, built, split, augmentations, label_spec, preview=False):
    """The read options of one split's pipeline, and the splits built with
    the dataset's label mode from then on: `(read, built)`.

    A layer that mixes labels (MixUp, CutMix) switches integer labels to
    one-hot for the whole dataset, so that `val()` built after it matches
    `train()` under one loss. Splits already built (`built`) keep their
    integer labels: a warning names them (a hyperparameter search that
    tries MixUp after a plain trial builds its splits again; one that mixes
    old and new would fail in Keras on the label shapes, not silently).
    """
    label_mode = label_mode_for(augmentations, read.label_mode, label_spec, preview)
    if label_mode == read.label_mode:
        return read, built | {split}
    if built and not preview:
        names = ", ".join(f"{name}()" for name in sorted(built))
        notices.warn(
            f"{names} of this dataset, built before, keep integer labels: "
            "build them again to match the one-hot labels from now on, or "
            "pass label_mode='categorical' to DatumDataset.",
        )
    return dataclasses.replace(read, label_mode=label_mode), {split}


def read_seed(seed):
    """The read's seed: the one given, else one drawn from TensorFlow's global
    seed when `keras.utils.set_random_seed` (or `tf.random.set_seed`) has set
    it, as TensorFlow's own random ops do, so that a run repeats as a whole;
    else `None` (a fresh stream, read in parallel in any order)."""
    if seed is not None:
        return seed
    global_seed, op_seed = tf.compat.v1.random.get_seed(None)
    return None if global_seed is None else int(op_seed)
