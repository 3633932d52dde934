"""Keras and KerasCV layers before and after batching, with real layers."""

import warnings

import keras
import keras_cv
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_class_folders

from keras_datum import DatumDataset


@pytest.fixture
def ds(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 8, "b": 8, "c": 8})
    return DatumDataset(root, image_size=(16, 16), batch_size=4, seed=1, verbose=False)


def _first_batch(dataset):
    x, y = next(iter(dataset))
    return x.numpy(), y.numpy()


def _all_x(dataset):
    return np.concatenate([x.numpy() for x, _ in dataset])


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda: keras.layers.RandomFlip("horizontal"),
        lambda: keras.layers.RandomRotation(0.2),
        lambda: keras.layers.RandAugment(value_range=(0, 255)),
        lambda: keras.layers.RandomColorJitter(value_range=(0, 255), brightness_factor=0.3),
        lambda: keras_cv.layers.RandomFlip("horizontal"),
        lambda: keras_cv.layers.RandAugment(value_range=(0, 255)),
        lambda: keras_cv.layers.RandomColorJitter(
            value_range=(0, 255), brightness_factor=0.3, contrast_factor=0.3,
            saturation_factor=0.3, hue_factor=0.1,
        ),
    ],
)
def test_per_example_layers_change_images_but_not_labels(ds, make_layer):
    plain_x = _all_x(ds.train(shuffle=False))
    plain_y = np.concatenate([y for _, y in ds.train(shuffle=False)])
    augmented = ds.train(shuffle=False, augment=make_layer())
    x = _all_x(augmented)
    y = np.concatenate([y for _, y in augmented])
    assert x.shape == plain_x.shape and x.dtype == np.float32
    assert not np.array_equal(x, plain_x)
    np.testing.assert_array_equal(y, plain_y)


def test_random_crop_changes_the_image_size(ds):
    x, _ = _first_batch(ds.train(augment=keras.layers.RandomCrop(10, 12)))
    assert x.shape == (4, 10, 12, 3)


def test_list_of_layers_and_a_callable_compose_in_order(ds):
    def add_seven(inputs):
        return dict(inputs, images=inputs["images"] + 7.0)

    def double(inputs):
        return dict(inputs, images=inputs["images"] * 2.0)

    plain, _ = _first_batch(ds.train(shuffle=False))
    composed, _ = _first_batch(ds.train(shuffle=False, augment=[add_seven, double]))
    np.testing.assert_allclose(composed, (plain + 7.0) * 2.0)
    batched, _ = _first_batch(ds.train(shuffle=False, batch_augment=double))
    np.testing.assert_allclose(batched, plain * 2.0)


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda: keras.layers.MixUp(),
        lambda: keras.layers.CutMix(),
        lambda: keras_cv.layers.MixUp(),
        lambda: keras_cv.layers.CutMix(),
    ],
)
def test_label_mixing_layers_switch_to_one_hot_and_train(ds, make_layer):
    with pytest.warns(UserWarning, match="mixes labels, so it needs one-hot float labels"):
        train = ds.train(batch_augment=make_layer())
    assert train.element_spec[1] == tf.TensorSpec((None, 3), tf.float32)
    # Validation follows, so one model fits both.
    assert ds.val().element_spec[1] == tf.TensorSpec((None, 3), tf.float32)
    # The layers draw their mixing weights unseeded; with 18 examples an epoch
    # can, rarely, pair only same-class rows or draw weights of 0 and 1 (seen
    # once in CI). A few epochs make "some labels are mixed" certain enough.
    for _ in range(5):
        ys = np.concatenate([y for _, y in train])
        np.testing.assert_allclose(ys.sum(axis=1), 1.0, rtol=1e-5)
        if ((ys > 0) & (ys < 1)).any():
            break
    assert ((ys > 0) & (ys < 1)).any(), "some labels must be mixed"
    model = keras.Sequential(
        [keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")]
    )
    model.compile("adam", "categorical_crossentropy")
    model.fit(train, validation_data=ds.val(), epochs=1, verbose=0)


def test_a_mixing_layer_after_integer_splits_were_built_says_so(ds):
    # A search's plain trial, then a MixUp trial on the same dataset.
    plain_val = ds.val()
    assert plain_val.element_spec[1] == tf.TensorSpec((None,), tf.int32)
    with pytest.warns(UserWarning, match=r"val\(\) of this dataset, built before, keep integer labels"):
        train = ds.train(batch_augment=keras.layers.MixUp())
    assert train.element_spec[1] == tf.TensorSpec((None, 3), tf.float32)
    # Built again, val() matches.
    assert ds.val().element_spec[1] == tf.TensorSpec((None, 3), tf.float32)


def test_a_preview_with_a_mixing_layer_leaves_the_label_mode_alone(ds, recwarn):
    ds.preview(batch_augment=keras.layers.MixUp(), num_images=4, seed=1)
    # Nothing to compile differently, so no warning tells the user to.
    assert not [w for w in recwarn if "mixes labels" in str(w.message)]
    assert ds.train().element_spec[1] == tf.TensorSpec((None,), tf.int32)
    assert ds.val().element_spec[1] == tf.TensorSpec((None,), tf.int32)


def test_datum_callback_aliases(ds):
    def flip(inputs):
        return dict(inputs, images=tf.reverse(inputs["images"], axis=[-2]))

    plain, _ = _first_batch(ds.train(shuffle=False))
    pre, _ = _first_batch(ds.train(shuffle=False, pre_batching_callback=flip))
    post, _ = _first_batch(ds.train(shuffle=False, post_batching_callback=flip))
    np.testing.assert_array_equal(pre, plain[:, :, ::-1])
    np.testing.assert_array_equal(post, plain[:, :, ::-1])
    with pytest.raises(ValueError, match="Pass `augment` or its alias `pre_batching_callback`, not both"):
        ds.train(augment=flip, pre_batching_callback=flip)


def test_seed_makes_the_augmented_stream_reproducible(ds, recwarn):
    def brighten(inputs):  # A random op with its own seed repeats too.
        return dict(inputs, images=inputs["images"] + tf.random.uniform([], 0, 9, seed=1))

    layers = [keras.layers.RandomFlip("horizontal"), keras_cv.layers.RandomRotation(0.3), brighten]
    first = _all_x(ds.train(augment=layers, seed=5))
    # So none is named as one that cannot repeat.
    assert not [w for w in recwarn if "global random state" in str(w.message)]
    again = _all_x(ds.train(augment=layers, seed=5))
    other = _all_x(ds.train(augment=layers, seed=6))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_a_seed_names_the_layers_it_cannot_make_repeat(ds):
    # KerasCV's MixUp draws its weights with tf.random.gamma, from TensorFlow's
    # global random state: no generator to restart.
    mix = keras_cv.layers.MixUp()
    with pytest.warns(UserWarning, match=r"With seed=5, these batch_augment steps still draw from "
                      r"TensorFlow's global random state.*MixUp \(name='mix_up.*'\) \(.*RandomGamma"):
        first = ds.train(batch_augment=[keras.layers.RandomFlip("horizontal"), mix], seed=5)
    second = ds.train(batch_augment=[keras.layers.RandomFlip("horizontal"), mix], seed=5)
    # What the warning says: the same seed, another stream.
    assert not np.array_equal(_all_x(first), _all_x(second))


def test_a_seed_makes_augmix_repeat(ds):
    """Keras's AugMix picks its operations with Python's `random` while it is
    traced: the seed seeds that too, and the user's `random` is left as it was."""
    import random

    augmix = keras.layers.AugMix(value_range=(0, 255))
    state = random.getstate()
    first = _all_x(ds.train(augment=augmix, seed=5))
    assert random.getstate() == state
    for _ in range(2):
        np.testing.assert_array_equal(first, _all_x(ds.train(augment=augmix, seed=5)))


def test_a_seed_names_a_function_whose_layer_it_cannot_restart(ds):
    rotate = keras.layers.RandomRotation(0.3)

    def rotate_step(inputs):
        return rotate(inputs)

    with pytest.warns(UserWarning, match=r"With seed=5, these augment steps .*keep state of their own.*"
                      r"rotate_step \(AssignVariableOp\).*pass layers themselves") as record:
        first = ds.train(augment=rotate_step, seed=5)
    # Named from the line that called train(), not autograph's generated file.
    assert [w.filename for w in record if "rotate_step" in str(w.message)] == [__file__]
    assert not np.array_equal(_all_x(first), _all_x(ds.train(augment=rotate_step, seed=5)))
    # The layer itself, passed in the list, repeats and is not named.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(
            _all_x(ds.train(augment=[rotate], seed=5)), _all_x(ds.train(augment=[rotate], seed=5))
        )


def test_augment_is_off_for_val_unless_asked(ds):
    plain = _all_x(ds.val())
    np.testing.assert_array_equal(plain, _all_x(ds.val()))
    flipped = _all_x(ds.val(augment=keras.layers.RandomFlip("horizontal", seed=3), seed=3))
    assert not np.array_equal(plain, flipped)


def test_not_a_layer_or_callable(ds):
    with pytest.raises(TypeError, match=r"`augment` must be a Keras layer, a callable, or a list of them. Received: augment='flip'"):
        ds.train(augment="flip")
    with pytest.raises(TypeError, match=r"`batch_augment` .* Received: batch_augment=3"):
        ds.train(batch_augment=[3])


def test_a_step_that_breaks_the_structure_is_named(ds):
    def images_only(inputs):
        return inputs["images"]

    with pytest.raises(ValueError, match=r"The augment step images_only must return the element dict with keys \['images', 'labels'\]"):
        ds.train(augment=images_only)


def test_a_layer_that_cannot_handle_the_element_is_named(ds):
    # Per example, KerasCV's MixUp has no batch to mix with.
    with pytest.raises(ValueError, match=r"The augment step MixUp \(name='mix_up.*'\) failed on the element"):
        ds.train(augment=keras_cv.layers.MixUp())


def test_checks_look_at_the_layers_a_container_holds():
    from keras_datum import augment

    flip, crop = keras.layers.RandomFlip(), keras_cv.layers.RandomCrop(4, 4)
    rand_augment = keras_cv.layers.RandAugment(value_range=(0, 255))
    nested = keras.layers.Pipeline([flip, keras.Sequential([keras.Input((8, 8, 3)), crop])])
    # Containers are opened (less a Sequential's input); an image layer is
    # looked at whole, whatever it holds; a plain callable owns the dict.
    assert augment.outer_layers(nested) == [flip, crop]
    assert augment.outer_layers(rand_augment) == [rand_augment]
    assert augment.outer_layers(lambda inputs: inputs) == []
    assert [augment.image_layer_family(layer) for layer in (flip, crop, nested)] == ["keras", "keras_cv", None]
