"""Values that a cache written by an earlier version depends on: a change to
any of them makes every user's cache export again (or live in another
folder). Recorded after the validation rules of issue 25 (export option
`validation: 2`); a refactoring must leave them as they are."""

import json

from keras_datum import cache
from keras_datum import config
from keras_datum import store

# The export options at the arguments' defaults, image_size=(224, 224).
EXPORT_OPTIONS = {
    "follow_links": False,
    "max_image_side": 448,
    "min_image_side": 224,
    "min_shards": 1,
    "problem": None,
    "seed": 1337,
    "validation": 2,
    "validation_split": 0.2,
}


def _options(validation_split=0.2):
    return config.ExportOptions.from_arguments(
        (224, 224), validation_split, None, False, None, "auto", 1
    )


def test_the_export_options_at_the_defaults_are_unchanged():
    assert _options().to_json() == EXPORT_OPTIONS


def test_the_default_cache_folder_names_are_unchanged(monkeypatch):
    monkeypatch.setenv("KERAS_HOME", "/home/k")
    assert store.default_cache_dir("/data/flowers") == "/home/k/datum/flowers-a9b2ae66ce"
    variant = _options(validation_split=0.1).carve_variant()
    assert variant == {"validation_split": 0.1, "max_image_side": 448}
    assert (store.default_cache_dir("/data/flowers", variant)
            == "/home/k/datum/flowers-5a6f89-a9b2ae66ce")


def test_the_export_key_of_a_metadata_text_is_unchanged():
    meta = {
        "created": "2026-01-01T00:00:00+00:00",
        "keras_datum_version": "0.1.0",
        "export_options": EXPORT_OPTIONS,
        "splits": {"train": {"num_examples": 3}},
    }
    assert int(store.export_key(cache.json_text(meta))) == 1615224723481854115
    # The time stamp and the version are left out of it.
    later = {**meta, "created": "2027-05-05T00:00:00+00:00", "keras_datum_version": "9"}
    assert int(store.export_key(cache.json_text(later))) == 1615224723481854115
    assert json.loads(cache.json_text(meta)) == meta
