"""Text classification: .txt class folders and datum's JSON layout."""

import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_datum import DatumDataset

WORDS = {"pos": ["good", "great", "fine", "nice"], "neg": ["bad", "awful", "poor", "sad"]}


def write_text_folders(root, per_class=6, seed=0):
    rng = np.random.default_rng(seed)
    texts = {}
    for label, words in WORDS.items():
        os.makedirs(root / label)
        for i in range(per_class):
            text = " ".join(rng.choice(words, size=int(rng.integers(1, 12))))
            (root / label / f"{i}.txt").write_text(text, encoding="utf-8")
            texts[text] = label
    return str(root), texts


def test_text_folders_match_keras(tmp_path):
    root, texts = write_text_folders(tmp_path / "src")
    ds = DatumDataset(root, batch_size=4, verbose=False)
    assert ds.info["problem"] == "text" and ds.info["layout"] == "class_folders"
    reference = keras.utils.text_dataset_from_directory(root, batch_size=None, shuffle=False, verbose=False)
    assert ds.class_names == reference.class_names == ["neg", "pos"]
    assert ds.train().element_spec == (
        tf.TensorSpec((None,), tf.string), tf.TensorSpec((None,), tf.int32)
    )
    got = {}
    for split in (ds.train(), ds.val()):
        for x, y in split.unbatch():
            got[x.numpy().decode()] = ds.class_names[int(y)]
    assert got == texts


def test_datum_json_layout(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    train = {str(i): {"text": f"text number {i}", "label": {"polarity": "pos" if i % 2 else "neg"}} for i in range(10)}
    val = {"a": {"text": "held out", "label": {"polarity": "neg"}}}
    (root / "train.json").write_text(json.dumps(train))
    (root / "val.json").write_text(json.dumps(val))
    ds = DatumDataset(str(root), label_mode="categorical", batch_size=None, verbose=False)
    assert ds.info["layout"] == "datum_json"
    assert ds.class_names == ["neg", "pos"]
    assert ds.num_examples == {"train": 10, "val": 1}
    (x, y), = list(ds.val())
    assert x.numpy() == b"held out" and y.numpy().tolist() == [1.0, 0.0]
    assert ds.file_paths("val") == [os.path.join(str(root), "val.json#a")]
    assert sorted(ds.file_paths("train")) == sorted(os.path.join(str(root), f"train.json#{i}") for i in range(10))


def test_datum_json_integer_labels_in_strings(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    data = {str(i): {"text": f"t{i}", "label": {"polarity": str(i % 3)}} for i in range(9)}
    (root / "train.json").write_text(json.dumps(data))
    ds = DatumDataset(str(root), validation_split=None, batch_size=None, verbose=False)
    assert ds.class_names == ["0", "1", "2"]
    assert sorted(int(y) for _, y in ds.train()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("content, match", [
    ("{", r"train.json: malformed JSON"),
    ('{"1": {"text": 3, "label": {"p": 1}}}', r"train.json: example '1' needs a string 'text'"),
    ('{"1": {"text": "x", "label": {"p": 1, "q": 2}}}', r"example '1' needs a 'label' object with one key"),
    ('{"1": {"text": "x", "label": {"p": [1]}}}', r"label 'p' must be a class index or name"),
    # json.load would keep only the second '1': an example lost without a word.
    ('{"1": {"text": "x", "label": {"p": 1}}, "1": {"text": "y", "label": {"p": 0}}}',
     r"train.json: the key '1' is repeated in one object"),
    ("{}", r"lists no training examples \(as a text source in the 'datum_json' layout: 0 train\)"),
])
def test_malformed_json_names_the_file_and_example(tmp_path, content, match):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.json").write_text(content)
    with pytest.raises(ValueError, match=match):
        DatumDataset(str(tmp_path / "src"), verbose=False).export()


def test_bucketing_groups_similar_lengths(tmp_path):
    root, _ = write_text_folders(tmp_path / "src", per_class=20)
    ds = DatumDataset(root, batch_size=4, bucket_boundaries=[4, 8], validation_split=None, verbose=False)
    seen = 0
    for x, _ in ds.train():
        lengths = [len(t.split()) for t in x.numpy()]
        buckets = {0 if n < 4 else 1 if n < 8 else 2 for n in lengths}
        assert len(buckets) == 1, lengths
        seen += len(lengths)
    assert seen == 40


def test_bucketed_batches_have_a_known_length(tmp_path):
    root, texts = write_text_folders(tmp_path / "src", per_class=20, seed=3)
    ds = DatumDataset(root, batch_size=3, bucket_boundaries=[3, 7], validation_split=0.25,
                      seed=1, verbose=False)
    for split, dataset in (("train", ds.train()), ("train", ds.train(seed=5)), ("val", ds.val())):
        sizes = [len(x) for x, _ in dataset]
        # Each bucket ends with its own short batch: more batches than 40 / 3 makes.
        assert sum(sizes) == ds.num_examples[split]
        assert len(dataset) == len(sizes), split
        assert len(dataset) == len([x for x, _ in dataset])  # The same again next epoch.
    plain = DatumDataset(root, batch_size=3, validation_split=0.25, seed=1, verbose=False)
    assert len(ds.train()) > len(plain.train()) == -(-ds.num_examples["train"] // 3)
    assert ds.train(repeat=True).cardinality() == tf.data.INFINITE_CARDINALITY


def test_invalid_utf8_is_reported(tmp_path):
    root, _ = write_text_folders(tmp_path / "src")
    (tmp_path / "src" / "pos" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    ds = DatumDataset(root, validation_split=None, verbose=False)
    with pytest.warns(UserWarning, match="1 invalid files"):
        ds.export()
    assert ds.invalid_files[0]["reason"].startswith("not UTF-8 text")


def test_text_vectorization_model_fits(tmp_path):
    root, _ = write_text_folders(tmp_path / "src", per_class=10)
    ds = DatumDataset(root, batch_size=4, verbose=False)
    vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=12)
    vectorize.adapt(ds.train().map(lambda x, y: x))
    model = keras.Sequential([
        keras.Input((), dtype="string"), vectorize, keras.layers.Embedding(20, 4),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(ds.train(), validation_data=ds.val(), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_bad_bucket_boundaries():
    with pytest.raises(ValueError, match=r"Received: bucket_boundaries=\[8, 4\]"):
        DatumDataset("/nonexistent", bucket_boundaries=[8, 4])


def test_an_augment_that_changes_lengths_keeps_bucketed_epochs_whole(tmp_path):
    # Buckets are made after augment: the count from the stored texts no
    # longer holds (tf.data would stop the epoch with 'expected N elements').
    root, _ = write_text_folders(tmp_path / "src", per_class=20, seed=3)
    ds = DatumDataset(root, batch_size=4, bucket_boundaries=[3, 7], validation_split=None,
                      verbose=False)
    assert len(ds.train()) == 11  # Three buckets of stored texts.

    def first_word(inputs):
        return {**inputs, "text": tf.strings.reduce_join(tf.strings.split(inputs["text"])[:1])}

    for _ in range(2):  # Every epoch whole.
        batches = [x for x, _ in ds.train(augment=first_word)]
        assert sum(len(x) for x in batches) == 40
        assert all(len(t.split()) == 1 for x in batches for t in x.numpy())
    assert len(batches) == 10  # One bucket: 40 / 4.


@pytest.mark.parametrize("argument", ["augment", "batch_augment"])
def test_an_image_layer_is_refused_for_text_before_any_export(tmp_path, argument):
    import keras_cv

    root, _ = write_text_folders(tmp_path / "src", per_class=3)
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(root, cache_dir=cache_dir, verbose=False)
    for layer in (
        keras.layers.RandomFlip("horizontal"),
        keras_cv.layers.RandomFlip("horizontal"),
        keras.layers.Pipeline([keras.layers.RandomFlip("horizontal")]),  # In a container too.
    ):
        with pytest.raises(ValueError, match=rf"The {argument} layer RandomFlip \(name='random_flip.*'\) "
                           r"works on images, and this dataset is text"):
            ds.train(**{argument: [layer]})
        assert not cache_dir.exists() or not any(cache_dir.iterdir())
    # A cache read as it is: refused all the same.
    ds.export()
    with pytest.raises(ValueError, match=r"works on images, and this dataset is text"):
        DatumDataset(root, cache_dir=cache_dir, reexport="never", verbose=False).train(
            **{argument: keras.layers.RandomFlip()}
        )


def test_image_dtype_is_refused_for_text_before_any_export(tmp_path):
    root, _ = write_text_folders(tmp_path / "src", per_class=3)
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(root, image_dtype="uint8", cache_dir=cache_dir, verbose=False)
    with pytest.raises(ValueError, match=r"`image_dtype` applies to images; this is a text dataset"):
        ds.train()
    # Refused once the layout was found, before the export wrote anything.
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    # An existing export is refused too, when it is read.
    DatumDataset(root, cache_dir=cache_dir, verbose=False).export()
    with pytest.raises(ValueError, match=r"`image_dtype` applies to images; this is a text dataset"):
        DatumDataset(root, image_dtype="uint8", cache_dir=cache_dir, verbose=False, reexport="never").train()


@pytest.mark.parametrize("name, value", [
    ("image_size", (64, 64)),
    ("color_mode", "grayscale"),
    ("interpolation", "nearest"),
    ("crop_to_aspect_ratio", True),
    ("pad_to_aspect_ratio", True),
    ("max_image_side", 100),
])
def test_image_options_are_refused_for_text_before_any_export(tmp_path, name, value):
    root, _ = write_text_folders(tmp_path / "src", per_class=3)
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(root, cache_dir=cache_dir, verbose=False, **{name: value})
    with pytest.raises(
        ValueError,
        match=rf"`{name}` applies to detection, segmentation and classification "
        rf"datasets, and this one is text, so it would be ignored",
    ):
        ds.train()
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_the_benchmark_command_reads_a_text_source(tmp_path, capsys):
    from keras_datum import cli

    root, _ = write_text_folders(tmp_path / "src", per_class=3)
    code = cli.main(["benchmark", root, "--cache-dir", str(tmp_path / "cache"),
                     "--epochs", "1", "--batch-size", "2", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["split"] == "train"


@pytest.mark.parametrize(
    "label, message",
    [
        (2000000000, r"example '3': the class label 2000000000 would make 2000000001 classes"),
        (-1, r"example '3': class labels must be >= 0\. Received: -1"),
    ],
)
def test_a_json_label_no_class_list_can_hold_names_the_file_and_the_example(
    tmp_path, label, message
):
    # range(2000000000 + 1) of class names would take gigabytes.
    root = tmp_path / "src"
    root.mkdir()
    train = {str(i): {"text": f"text {i}", "label": {"topic": i % 2}} for i in range(6)}
    train["3"]["label"]["topic"] = label
    (root / "train.json").write_text(json.dumps(train))
    path = os.path.join(str(root), "train.json")
    with pytest.raises(ValueError, match=re.escape(path) + ": " + message):
        DatumDataset(str(root), cache_dir=tmp_path / "cache", verbose=False).export()


def test_max_length_cuts_texts_at_bytes_as_keras(tmp_path):
    root = tmp_path / "src"
    for label, text in (("a", "héllo wörld"), ("b", "short")):
        os.makedirs(root / label)
        (root / label / "0.txt").write_text(text, encoding="utf-8")
    ds = DatumDataset(root, max_length=4, batch_size=None, shuffle=False,
                      validation_split=None, cache_dir=tmp_path / "cache", verbose=False)
    reference = keras.utils.text_dataset_from_directory(
        str(root), max_length=4, batch_size=None, shuffle=False, verbose=False
    )
    ours = sorted(x.numpy() for x, _ in ds.train())
    assert ours == sorted(x.numpy() for x, _ in reference) == [b"h\xc3\xa9l", b"shor"]
    with pytest.raises(ValueError, match=r"Received: max_length=0"):
        DatumDataset(root, max_length=0)


def test_max_length_is_refused_for_images(class_folders):
    with pytest.raises(ValueError, match=r"`max_length` applies to text datasets, and this "
                       r"one is classification"):
        DatumDataset(class_folders, max_length=10, verbose=False).info


def test_a_text_folder_without_text_files_says_so(tmp_path):
    os.makedirs(tmp_path / "src" / "a")
    (tmp_path / "src" / "a" / "notes.md").write_text("x")
    with pytest.raises(ValueError, match=r"No text files found in directory .*src'. "
                       r"Allowed format: \.txt"):
        DatumDataset(tmp_path / "src", problem="text", verbose=False).info


def test_an_image_among_text_files_is_named(tmp_path):
    root, _ = write_text_folders(tmp_path / "src")
    from PIL import Image

    Image.new("RGB", (4, 4)).save(os.path.join(root, "pos", "photo.png"))
    with pytest.raises(ValueError, match=r"photo\.png' is an image, and a text dataset"):
        DatumDataset(root, problem="text", verbose=False).info


def test_label_mode_none_reads_every_text_file_as_keras(tmp_path):
    root, _ = write_text_folders(tmp_path / "src")
    (tmp_path / "src" / "loose.txt").write_text("loose words", encoding="utf-8")
    ds = DatumDataset(root, label_mode=None, batch_size=None, validation_split=None,
                      cache_dir=tmp_path / "cache", verbose=False)
    reference = keras.utils.text_dataset_from_directory(
        root, label_mode=None, batch_size=None, shuffle=False, verbose=False
    )
    assert ds.info["problem"] == "text" and ds.class_names is None
    ours = sorted(x.numpy() for x in ds.train(shuffle=False))
    assert ours == sorted(x.numpy() for x in reference)
    assert len(ours) == 2 * 6 + 1  # Both classes' files and the loose one.


def test_max_length_with_buckets_counts_the_batches_of_the_cut_texts(tmp_path):
    root = tmp_path / "src"
    for label, lengths in (("a", [2, 3, 30, 40]), ("b", [1, 25, 35, 50])):
        os.makedirs(root / label)
        for i, n in enumerate(lengths):
            (root / label / f"{i}.txt").write_text(" ".join(["word"] * n), encoding="utf-8")
    ds = DatumDataset(root, max_length=20, bucket_boundaries=[8], batch_size=2,
                      validation_split=None, cache_dir=tmp_path / "cache", verbose=False)
    # Cut to 20 bytes, every text has at most 4 words: one bucket of 8 texts.
    batches = list(ds.train())
    assert len(batches) == len(ds.train()) == 4
    assert all(len(x.numpy()[0]) <= 20 for x, _ in batches)


def test_interpolation_in_capitals_is_the_default_on_a_text_dataset(tmp_path):
    root, _ = write_text_folders(tmp_path / "src")
    ds = DatumDataset(root, interpolation="BILINEAR", cache_dir=tmp_path / "cache",
                      verbose=False)
    assert ds.info["problem"] == "text"
