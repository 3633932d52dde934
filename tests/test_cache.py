"""The cache's metadata schema, atomic commit, leftovers and lock."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from keras_datum import CacheError
from keras_datum import DatumDataset
from keras_datum import cache
from keras_datum import cli
from keras_datum import store


def _exported(class_folders):
    ds = DatumDataset(class_folders, verbose=False)
    ds.export()
    return ds


@pytest.mark.parametrize("damage", ["truncated", "not utf-8"])
def test_damaged_metadata_gets_a_clear_error(class_folders, tmp_path, damage):
    ds = _exported(class_folders)
    path = os.path.join(ds.cache_dir, "metadata.json")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if damage == "truncated" else b"\xff" + data[1:])
    with pytest.raises(CacheError, match=r"metadata .*metadata.json' is not valid JSON"):
        DatumDataset(class_folders, verbose=False).export()
    assert cli.main(["verify", ds.cache_dir]) == 1
    # Another carve's dataset never reads that cache, damaged or not.
    other = DatumDataset(class_folders, validation_split=0.5, verbose=False)
    assert other.num_examples == {"train": 15, "val": 15}


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.update(schema_version=99), "schema_version 99 is not 1"),
        (lambda m: m.pop("class_names"), "'class_names' must be a list"),
        (lambda m: m["splits"]["train"].update(num_examples=5), "shard lengths do not add up to 5"),
        (lambda m: m["splits"]["train"]["shards"][0].update(file="../../x"), "malformed shard entry"),
        (lambda m: m["splits"].pop("train"), "there is no 'train' split"),
        # A model built from len(ds.class_names) would have the wrong outputs.
        (lambda m: m["class_names"].append("fox"), "'class_names' holds 4 names, and 'label_spec' says 3 classes"),
    ],
)
def test_hand_edited_metadata_is_validated(class_folders, edit, match):
    ds = _exported(class_folders)
    path = os.path.join(ds.cache_dir, "metadata.json")
    with open(path) as f:
        meta = json.load(f)
    edit(meta)
    with open(path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(CacheError, match=match):
        cache.read_metadata(ds.cache_dir)


def test_reexport_always_rebuilds_a_broken_cache(class_folders):
    ds = _exported(class_folders)
    with open(os.path.join(ds.cache_dir, "metadata.json"), "w") as f:
        f.write("{")
    rebuilt = DatumDataset(class_folders, reexport="always", verbose=False)
    assert sum(rebuilt.num_examples.values()) == 30


def test_leftover_temporary_folders_are_removed(class_folders, tmp_path):
    cache_dir = tmp_path / "cache"
    # What killed exports leave: a temporary folder (marked, or killed
    # before its mark: empty), an old cache being replaced (marked).
    for name in ("cache.tmp-12345-deadbeef", "cache.old-0badf00d"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train-00000-of-00001.tfrecord").write_bytes(b"partial")
        (tmp_path / name / store.LEFTOVER_MARK).write_text("")
    (tmp_path / "cache.tmp-12345-00000000").mkdir()
    # A user's folders of like names (a dated backup is 8 hex digits) have
    # no mark, and are never removed.
    for name in ("cache.old-20240101", "cache.tmp-1-20240101"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "thesis.tex").write_text("years of work")
    DatumDataset(class_folders, cache_dir=cache_dir, verbose=False).export()
    assert sorted(os.listdir(tmp_path)) == [
        "cache", "cache.lock", "cache.old-20240101", "cache.tmp-1-20240101", "src"
    ]
    # Nor is a source of such a name, exported into a cache beside it.
    source = tmp_path / "data.old-20240101"
    os.rename(class_folders, source)
    ds = DatumDataset(source, cache_dir=tmp_path / "data", verbose=False)
    assert sum(ds.num_examples.values()) > 0
    ds.export(force=True)  # Replaces the cache: its old copy is removed.
    assert sorted(os.listdir(tmp_path))[:4] == ["cache", "cache.lock", "cache.old-20240101", "cache.tmp-1-20240101"]
    assert sorted(os.listdir(tmp_path))[4:] == ["data", "data.lock", "data.old-20240101"]
    assert (tmp_path / "cache.old-20240101" / "thesis.tex").read_text() == "years of work"
    assert not list(tmp_path.glob(f"*/{store.LEFTOVER_MARK}"))


def test_a_folder_without_metadata_is_not_trusted(class_folders, tmp_path):
    cache_dir = tmp_path / "cache"
    ds = DatumDataset(class_folders, cache_dir=cache_dir, verbose=False)
    ds.export()
    os.remove(cache_dir / "metadata.json")
    # Shards without metadata are a foreign folder now: it is not read, and
    # not deleted either.
    with pytest.raises(ValueError, match="is not a keras_datum cache"):
        DatumDataset(class_folders, cache_dir=cache_dir, verbose=False).export()


def test_a_users_folder_with_a_metadata_json_is_never_replaced(class_folders, tmp_path):
    """A file merely named metadata.json does not make a folder a cache: no
    re-export, forced or not, renames it away and deletes it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metadata.json").write_text('{"author": "me"}')
    (mine / "thesis.tex").write_text("years of work")
    assert not store.is_cache_folder(str(mine))
    for reexport in ("auto", "always"):
        with pytest.raises((ValueError, CacheError)):
            DatumDataset(class_folders, cache_dir=mine, reexport=reexport, verbose=False).export()
    assert sorted(os.listdir(mine)) == ["metadata.json", "thesis.tex"]
    # A cache of ours whose metadata.json was damaged is still ours: replaced.
    ours = tmp_path / "ours"
    DatumDataset(class_folders, cache_dir=ours, verbose=False).export()
    (ours / "metadata.json").write_text("{not json")
    assert store.is_cache_folder(str(ours))
    DatumDataset(class_folders, cache_dir=ours, reexport="always", verbose=False).export()
    assert cache.read_metadata(str(ours))["schema_version"] == 1


def test_only_our_leftover_folders_are_removed(tmp_path):
    for name in ("flowers.old-2019", "flowers.tmp-notes", "flowers.tmp-12-0123abcd",
                 "flowers.old-89abcdef", "flowers.old-20240101", "flowers.tmp-7-20240101"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("x")
    for name in ("flowers.tmp-12-0123abcd", "flowers.old-89abcdef"):
        (tmp_path / name / store.LEFTOVER_MARK).write_text("")
    # Unmarked, holding only what an export writes (killed outside the
    # marked span, or by a version without marks): a temporary folder goes,
    # an old cache (perhaps a user's copy) stays.
    for name in ("flowers.tmp-3-abcdef01", "flowers.old-abcdef01"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train-00000-of-00001.tfrecord").write_bytes(b"partial")
        (tmp_path / name / "features.json").write_text("{}")
    store.remove_leftovers(str(tmp_path / "flowers"))
    # A died export's temporary folder and a commit's old cache (marked) go;
    # a user's folders that share the prefix, or the whole name, stay.
    assert sorted(os.listdir(tmp_path)) == [
        "flowers.old-2019", "flowers.old-20240101", "flowers.old-abcdef01",
        "flowers.tmp-7-20240101", "flowers.tmp-notes",
    ]


def test_a_commit_that_cannot_mark_the_old_cache_still_puts_the_new_one_in_place(
    class_folders, tmp_path, monkeypatch
):
    ds = DatumDataset(class_folders, cache_dir=tmp_path / "cache", verbose=False)
    ds.export()
    mark = store.mark_leftover

    def full_disk_for_old(folder):
        if ".old-" in folder:
            raise OSError(28, "No space left on device")
        mark(folder)

    monkeypatch.setattr(store, "mark_leftover", full_disk_for_old)
    meta = ds.export(force=True)
    assert cache.read_metadata(str(tmp_path / "cache"))["created"] == meta["created"]
    # Unmarked, the old cache is removed all the same once the new one is in place.
    assert not list(tmp_path.glob("cache.old-*"))


def test_an_empty_class_folder_added_exports_again(class_folders):
    first = DatumDataset(class_folders, verbose=False)
    names = first.class_names
    os.makedirs(os.path.join(class_folders, "zz_empty"))
    # Keras counts an empty class folder; a cache made before it must not be trusted.
    again = DatumDataset(class_folders, verbose=False)
    assert again.class_names == [*names, "zz_empty"]
    assert again.info["created"] != first.info["created"]


def test_lock_timeout_names_the_holder(tmp_path):
    cache_dir = str(tmp_path / "cache")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from keras_datum.store import export_lock
                with export_lock({cache_dir!r}, 5):
                    print("locked", flush=True)
                    time.sleep(30)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TimeoutError, match=rf"held by pid {holder.pid} on "):
            with store.export_lock(cache_dir, 0.5):
                pass
    finally:
        holder.kill()
        holder.wait()
    with store.export_lock(cache_dir, 5):  # Released when its holder died.
        pass


def test_a_bad_feature_spec_in_metadata_is_a_cache_error(class_folders):
    ds = _exported(class_folders)
    path = os.path.join(ds.cache_dir, "metadata.json")
    with open(path) as f:
        meta = json.load(f)
    meta["features"]["label"] = {"dtype": "complex128"}
    with open(path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(CacheError, match="feature 'label' needs a dtype"):
        cache.read_metadata(ds.cache_dir)


def test_datasets_with_other_carves_get_their_own_caches(class_folders):
    default = DatumDataset(class_folders, verbose=False)
    # The default carve keeps the cache folder it always had.
    assert default.cache_dir == store.default_cache_dir(class_folders)
    other_seed = DatumDataset(class_folders, seed=7, verbose=False)
    other_split = DatumDataset(class_folders, validation_split=0.5, verbose=False)
    dirs = {default.cache_dir, other_seed.cache_dir, other_split.cache_dir}
    assert len(dirs) == 3
    val_before = _val_files(default)
    other_seed.export()
    other_split.export()
    # Neither export touched the first dataset's cache: its val() is the same.
    assert _val_files(default) == val_before
    assert len(_val_files(other_split)) == 15
    assert sorted(store.caches_of(class_folders)) == sorted(dirs)


def _val_files(ds):
    import tensorflow as tf

    names = []
    for shard in ds.info["splits"]["val"]["shards"]:
        for record in tf.data.TFRecordDataset(os.path.join(ds.cache_dir, shard["file"])):
            example = tf.train.Example.FromString(record.numpy())
            names.append(example.features.feature["source/filename"].bytes_list.value[0])
    ds.val()  # Still builds: its cache was not exported over.
    return sorted(names)


def test_a_dataset_refuses_a_cache_exported_over_it(class_folders, tmp_path):
    shared = tmp_path / "shared"
    first = DatumDataset(class_folders, cache_dir=shared, seed=1, verbose=False)
    first.train()
    # Another carve into the same cache_dir exports over the first's shards.
    DatumDataset(class_folders, cache_dir=shared, seed=2, verbose=False).train()
    for build in (first.train, first.val):
        with pytest.raises(RuntimeError, match=r"was exported again .* Create the DatumDataset again"):
            build()
    # Made again, it reads the cache as it now is.
    assert len(list(DatumDataset(class_folders, cache_dir=shared, seed=2, verbose=False).val())) > 0


def test_a_metadata_file_reformatted_by_hand_is_still_read(class_folders, tmp_path):
    # Same content, other text (an editor's indent and key order): the cache
    # is as fresh as before, and reading it must not blame another export.
    ds = DatumDataset(class_folders, cache_dir=tmp_path / "cache", cache=False, verbose=False)
    expected = sum(int(tf_batch[1].shape[0]) for tf_batch in ds.train())
    path = tmp_path / "cache" / "metadata.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps(dict(reversed(list(meta.items()))), indent=4))
    again = DatumDataset(class_folders, cache_dir=tmp_path / "cache", cache=False, verbose=False)
    assert sum(int(batch[1].shape[0]) for batch in again.train()) == expected == 24
    assert json.loads(path.read_text()) == meta  # Read as it is, not exported again.
    # The time stamp is left out of the key however it is spaced.
    assert int(store.export_key('{"created" : "2026-01-01", "a": 1}')) == int(
        store.export_key('{"created" : "2027-02-02", "a": 1}')
    )


# A folder name with glob characters is checked all the same.
@pytest.mark.parametrize("cache_decoded,name", [(True, "shared"), (False, "shared"), (False, "shared[1]*?")])
def test_a_split_built_before_another_carve_was_exported_over_it_fails_loudly(
    class_folders, tmp_path, cache_decoded, name
):
    import tensorflow as tf

    shared = tmp_path / name
    first = DatumDataset(class_folders, cache_dir=shared, seed=1, cache=cache_decoded, verbose=False)
    train = first.train()
    # Same counts, other carve: without the check this would read the other
    # carve's train split, holding images of this one's val().
    DatumDataset(class_folders, cache_dir=shared, seed=2, verbose=False).export()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"was exported again \(or removed\) after this dataset read it"):
        list(train)


def test_an_export_of_the_same_content_leaves_other_datasets_working(class_folders):
    first = DatumDataset(class_folders, verbose=False)
    train = first.train()
    # A notebook's second cell, `keras-datum export --force`, or a search
    # trial with reexport="always": the same content, exported again.
    DatumDataset(class_folders, reexport="always", verbose=False).export()
    DatumDataset(class_folders, verbose=False).export(force=True)
    assert sum(len(x) for x, _ in train) == 24
    assert sum(len(x) for x, _ in first.val()) == 6


@pytest.mark.parametrize("where", ["inside", "same", "around"])
def test_a_cache_dir_inside_or_around_the_source_is_refused(class_folders, where):
    cache_dir = {
        "inside": os.path.join(class_folders, "cache"),
        "same": class_folders,
        "around": os.path.dirname(class_folders),
    }[where]
    before = sorted(os.listdir(class_folders))
    with pytest.raises(ValueError, match="`cache_dir` .* must be outside the source folder"):
        DatumDataset(class_folders, cache_dir=cache_dir, verbose=False)
    assert sorted(os.listdir(class_folders)) == before


def test_a_cache_below_a_hidden_folder_of_the_source_is_allowed(class_folders):
    # Hidden folders are never read as data: `$KERAS_HOME` at `<source>/.keras`.
    ds = DatumDataset(class_folders, cache_dir=os.path.join(class_folders, ".keras", "c"), verbose=False)
    assert ds.class_names == ["bird", "cat", "dog"]
    ds.export(force=True)
    assert ds.class_names == ["bird", "cat", "dog"]
