"""Every bad input gets its own clear error, raised before any work."""

import os
import shutil

import pytest
from conftest import make_class_folders

from keras_datum import DatumDataset


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image_size": 0}, r"`image_size` must be a positive integer or a tuple of 2 positive integers.*Received: image_size=0"),
        ({"image_size": "224"}, r"Received: image_size='224'"),
        ({"image_size": (0, 10)}, r"Received: image_size=\(0, 10\)"),
        ({"image_size": (10.5, 10)}, r"Received: image_size=\(10.5, 10\)"),
        ({"batch_size": 0}, r"`batch_size` must be a positive integer or None. Received: batch_size=0"),
        ({"batch_size": True}, r"Received: batch_size=True"),
        ({"validation_split": 1.0}, r"`validation_split` must be a float in \[0, 1\) or None. Received: validation_split=1.0"),
        ({"validation_split": -0.1}, r"Received: validation_split=-0.1"),
        ({"validation_split": "0.2"}, r"Received: validation_split='0.2'"),
        ({"label_mode": "onehot"}, r"`label_mode` must be one of 'int', 'categorical', 'binary', None. Received: label_mode='onehot'"),
        ({"color_mode": "cmyk"}, r"`color_mode` must be one of .* Received: color_mode='cmyk'"),
        ({"interpolation": "cubic"}, r"Received: interpolation='cubic'"),
        ({"crop_to_aspect_ratio": True, "pad_to_aspect_ratio": True}, r"Only one of `pad_to_aspect_ratio`, `crop_to_aspect_ratio`"),
        ({"seed": 1.5}, r"`seed` must be a non-negative integer below 2\*\*63, or None. Received: seed=1.5"),
        ({"seed": -1}, r"Received: seed=-1"),
        ({"seed": 2**63}, r"Received: seed=9223372036854775808"),
        ({"shuffle_buffer_size": 0}, r"Received: shuffle_buffer_size=0"),
        ({"on_invalid": "ignore"}, r"Received: on_invalid='ignore'"),
        ({"reexport": "sometimes"}, r"Received: reexport='sometimes'"),
        ({"problem": "ranking"}, r"Received: problem='ranking'"),
        ({"image_dtype": "float64"}, r"`image_dtype` must be one of None, 'uint8'. Received: image_dtype='float64'"),
        # 1 == True and 0 == False, but an int is not a bool option.
        ({"cache": 1}, r"`cache` must be one of 'auto', True, False. Received: cache=1"),
        ({"cache": 0.0}, r"Received: cache=0.0"),
        ({"cache": False, "cache_budget": 10}, r"`cache_budget` sizes the automatic cache, so it applies only with cache='auto'. Received: cache=False, cache_budget=10"),
        ({"cache": True, "cache_budget": 10}, r"Received: cache=True, cache_budget=10"),
    ],
)
def test_bad_arguments_raise_in_the_constructor(tmp_path, kwargs, match):
    # A missing source would also fail: the argument check must come first,
    # before any disk access.
    with pytest.raises(ValueError, match=match):
        DatumDataset(str(tmp_path / "does-not-exist"), **kwargs)


def test_missing_path(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="Source folder not found: .*nope"):
        DatumDataset(missing)


def test_source_that_is_a_file(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match="`source` must be a folder. Received a file"):
        DatumDataset(str(path))


def test_source_of_wrong_type():
    with pytest.raises(TypeError, match="`source` must be a path to a folder. Received: source=3"):
        DatumDataset(3)


def test_empty_folder(tmp_path):
    os.makedirs(tmp_path / "empty")
    ds = DatumDataset(str(tmp_path / "empty"), verbose=False)
    with pytest.raises(ValueError, match="The source folder .*empty' is empty"):
        ds.export()


def test_folder_without_class_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="No class folders found in .*flat"):
        DatumDataset(str(tmp_path / "flat"), verbose=False).export()


def test_class_folders_without_images(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "notes.md").write_text("x")
    with pytest.raises(ValueError, match=r"No images found in .*src'. Expected files ending in one of .bmp"):
        DatumDataset(str(tmp_path / "src"), verbose=False).export()


def test_binary_with_three_classes(class_folders):
    ds = DatumDataset(class_folders, label_mode="binary", verbose=False)
    with pytest.raises(ValueError, match=r'label_mode="binary"`, there must be exactly 2 classes. Received: class_names=\[.bird., .cat., .dog.\]'):
        ds.train()
    # Nothing was written: the check comes before the export.
    assert not os.path.exists(ds.cache_dir)


def test_missing_test_split(class_folders):
    ds = DatumDataset(class_folders, verbose=False)
    with pytest.raises(ValueError, match=r"no 'test' split. Its splits are \['train', 'val'\]"):
        ds.test()


def test_split_folder_with_unknown_class(tmp_path):
    make_class_folders(tmp_path / "src" / "train", {"a": 2})
    make_class_folders(tmp_path / "src" / "val", {"a": 1, "zebra": 1})
    with pytest.raises(ValueError, match=r"val' has class folders that 'train/' lacks: \['zebra'\]"):
        DatumDataset(str(tmp_path / "src"), verbose=False).export()


def test_both_val_and_validation_folders(tmp_path):
    for split in ("train", "val", "validation"):
        make_class_folders(tmp_path / "src" / split, {"a": 1})
    with pytest.raises(ValueError, match="has both 'val/' and 'validation/' folders"):
        DatumDataset(str(tmp_path / "src"), verbose=False).export()


def test_cache_dir_holding_user_files_is_never_overwritten(class_folders, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    ds = DatumDataset(class_folders, cache_dir=precious, verbose=False)
    with pytest.raises(ValueError, match="exists and is not a keras_datum cache"):
        ds.export()
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert os.listdir(precious) == ["thesis.tex"]


def test_files_saved_into_a_cache_are_never_deleted_by_an_export(class_folders, tmp_path):
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(class_folders, cache_dir=cache_dir, verbose=False)
    ds.export()
    (cache_dir / "best_model.keras").write_text("weights")
    (cache_dir / "logs").mkdir()
    (cache_dir / ".DS_Store").write_bytes(b"")  # Finder's, written by a look: not named.
    (cache_dir / ".notes").write_text("mine")  # Hidden, but the user's.
    (cache_dir / ".git").mkdir()
    # Reading the cache leaves them alone.
    assert len(list(DatumDataset(class_folders, cache_dir=cache_dir, verbose=False).val())) > 0
    # Exporting again would replace the folder, so it is refused, naming them.
    with pytest.raises(ValueError, match=r"holds files keras_datum did not write: \['.git', '.notes', 'best_model.keras', 'logs'\]"):
        DatumDataset(class_folders, cache_dir=cache_dir, verbose=False).export(force=True)
    assert (cache_dir / "best_model.keras").read_text() == "weights" and (cache_dir / "logs").is_dir()
    assert (cache_dir / ".notes").read_text() == "mine" and (cache_dir / ".git").is_dir()
    assert DatumDataset(class_folders, cache_dir=cache_dir, reexport="never", verbose=False).num_examples == ds.num_examples
    # With only the system's files beside its own, the export goes ahead.
    for name in (".notes", ".git", "best_model.keras", "logs"):
        shutil.rmtree(cache_dir / name) if (cache_dir / name).is_dir() else (cache_dir / name).unlink()
    (cache_dir / "._metadata.json").write_bytes(b"")  # macOS's AppleDouble file on a shared drive.
    DatumDataset(class_folders, cache_dir=cache_dir, verbose=False).export(force=True)


def test_numpy_numbers_are_accepted_and_stored_as_python_ones(class_folders):
    import numpy as np

    ds = DatumDataset(class_folders, image_size=(np.int64(16), np.int32(16)), batch_size=np.int64(4),
                      validation_split=np.float32(0.25), seed=np.int64(3), max_image_side=np.int64(32),
                      verbose=False)
    options = ds.info["export_options"]  # Written to metadata.json: plain JSON numbers.
    assert options["seed"] == 3 and options["max_image_side"] == 32
    assert options["validation_split"] == 0.25
    assert next(iter(ds.train(seed=np.int64(1))))[0].shape == (4, 16, 16, 3)


def test_a_cache_dir_that_is_a_symlink_holds_the_cache_where_it_points(class_folders, tmp_path):
    target = tmp_path / "big_disk" / "cache"
    target.mkdir(parents=True)
    link = tmp_path / "cache_link"
    link.symlink_to(target)
    ds = DatumDataset(class_folders, cache_dir=link, verbose=False)
    ds.export()
    ds.export(force=True)  # Replacing a cache goes through the link too.
    assert os.path.islink(link)
    assert os.path.isfile(target / "metadata.json")
    assert sum(ds.num_examples.values()) == 30


@pytest.mark.parametrize("name", ["crop_to_aspect_ratio", "pad_to_aspect_ratio", "shuffle", "follow_links", "verbose"])
def test_flags_must_be_booleans(tmp_path, name):
    # "no" is a true string: it would switch the option on.
    root = make_class_folders(tmp_path / "src", {"a": 2, "b": 2})
    with pytest.raises(ValueError, match=rf"`{name}` must be True or False. Received: {name}='no'"):
        DatumDataset(root, **{name: "no"})


def test_batch_augment_without_batches_and_bad_preview_arguments_are_named(tmp_path):
    root = make_class_folders(tmp_path / "src", {"a": 2, "b": 2})
    ds = DatumDataset(root, image_size=(8, 8), batch_size=None, verbose=False)
    with pytest.raises(ValueError, match=r"`batch_augment` \(or `post_batching_callback`\) works on batches, but `batch_size` is None"):
        ds.train(batch_augment=lambda inputs: inputs)
    with pytest.raises(ValueError, match=r"`shuffle` must be True or False"):
        ds.train(shuffle="yes")
    for name, value in (("num_images", 0), ("num_images", -1), ("columns", 0)):
        with pytest.raises(ValueError, match=rf"`{name}` must be a positive integer. Received: {name}={value}"):
            ds.preview(**{name: value})


@pytest.mark.parametrize("kwargs, error, message", [
    ({"split": "tset"}, ValueError, r"`split` must be one of \['train', 'val', 'test'\]. Received: split='tset'"),
    ({"seed": -1}, ValueError, r"`seed` must be a non-negative integer"),
    ({"augment": 5}, TypeError, r"`augment` must be a Keras layer"),
    ({"path": "grid.txt"}, ValueError, r"`path` must end in an image format matplotlib saves \(.*png.*\). Received: path='grid.txt'"),
])
def test_bad_preview_arguments_are_refused_before_the_export(tmp_path, kwargs, error, message):
    root = make_class_folders(tmp_path / "src", {"a": 2, "b": 2})
    ds = DatumDataset(root, image_size=(8, 8), cache_dir=tmp_path / "cache", verbose=False)
    with pytest.raises(error, match=message):
        ds.preview(**kwargs)
    assert not os.path.exists(tmp_path / "cache")


@pytest.mark.parametrize("name, value, owners", [
    ("bucket_boundaries", [4, 8], "text"),
    ("max_boxes", 5, "detection"),
    ("bounding_box_format", "xywh", "detection"),
    ("bounding_box_class_key", "classes", "detection"),
])
def test_options_of_another_problem_type_are_refused_before_export(tmp_path, name, value, owners):
    root = make_class_folders(tmp_path / "src", {"a": 2, "b": 2})
    ds = DatumDataset(root, verbose=False, **{name: value})
    with pytest.raises(ValueError, match=rf"`{name}` applies to {owners} datasets, and this one is classification"):
        ds.export()
    assert not os.path.exists(ds.cache_dir)


def test_a_bad_data_service_is_named_before_any_export(class_folders, tmp_path):
    ds = DatumDataset(class_folders, cache_dir=tmp_path / "cache", verbose=False)
    for bad in (True, "", 5050):
        with pytest.raises(ValueError, match=r"`data_service` must be a tf.data service dispatcher address"):
            ds.train(data_service=bad)
    assert not (tmp_path / "cache").exists()


def test_export_force_and_cache_dir_are_checked_and_invalid_files_exports(class_folders, tmp_path):
    for bad in (5, b"/tmp/cache", ""):
        with pytest.raises(TypeError, match=r"`cache_dir` must be a path to a folder"):
            DatumDataset(class_folders, cache_dir=bad, verbose=False)
    ds = DatumDataset(class_folders, cache_dir=tmp_path / "cache", verbose=False)
    # The first use exports, as for `info`, instead of a bare FileNotFoundError.
    assert ds.invalid_files == [] and (tmp_path / "cache" / "metadata.json").exists()
    # A string such as "no" would be true: a whole export again.
    with pytest.raises(ValueError, match=r"`force` must be True or False. Received: force='no'"):
        ds.export(force="no")

