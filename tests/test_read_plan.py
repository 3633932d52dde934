"""The read path's decisions (`read_plan.ReadPlan`), from metadata made here: no export."""

import dataclasses

import pytest
import tensorflow as tf

from keras_datum import blocks
from keras_datum import read_plan
from keras_datum import shard_reader
from keras_datum.config import ReadOptions
from keras_datum.metadata import Metadata
from keras_datum.read_plan import ReadPlan


def metadata(counts=(40, 40, 40), problem="classification", heights=(8, 8), widths=(8, 8),
             raw="all", raw_channels=(3,), label_type="class"):
    """Metadata of a `train` split in shard files of `counts` examples."""
    shards = [
        {"file": f"train-{i:05d}-of-{len(counts):05d}.tfrecord", "num_examples": n}
        for i, n in enumerate(counts)
    ]
    total = sum(counts)
    train = {
        "num_examples": total, "shards": shards,
        "image_sizes": {"height": {"min": heights[0], "max": heights[1]},
                        "width": {"min": widths[0], "max": widths[1]}},
        "raw_images": {"all": total, "some": 1, "none": 0}[raw],
        "raw_channels": list(raw_channels),
    }
    return Metadata.from_json({
        "problem": problem, "layout": "class_folders", "class_names": ["a", "b"],
        "label_spec": {"type": label_type, "num_classes": 2}, "features": {},
        "export_options": {}, "source_fingerprint": {}, "invalid_files": {"count": 0},
        "splits": {"train": train},
    })


def plan(meta=None, options=None, **kwargs):
    kwargs = {"batch_size": 4, "shuffle": False, "repeat": False, "seed": None,
              "shuffle_buffer_size": None, **kwargs}
    return ReadPlan.make(meta or metadata(), "/nonexistent-cache", "train",
                         options or ReadOptions(image_size=(8, 8)), **kwargs)


def augmentation(inputs):
    return inputs


def test_the_block_path_for_same_size_raw_pixels_batched_with_nothing_per_example():
    chosen = plan()
    assert chosen.raw_layout == blocks.RawLayout(8, 8, 3)
    assert chosen.block_path
    # Resized, or gray raw pixels read as RGB: still whole blocks.
    assert plan(options=ReadOptions(image_size=(6, 10))).block_path
    assert plan(metadata(raw_channels=(1,))).block_path


@pytest.mark.parametrize(
    "meta, options, kwargs",
    [
        (None, None, {"augment": augmentation}),  # A step per example.
        (None, None, {"batch_size": None}),
        (None, None, {"shard_subset": (1, 5)}),  # Three files, five readers.
        (metadata(heights=(8, 9)), None, {}),  # Mixed sizes.
        (metadata(raw="some"), None, {}),
        (metadata(raw_channels=(1, 3)), None, {}),
        (metadata(label_type="multi_label"), None, {}),
        (None, ReadOptions(image_size=(8, 8), label_mode="binary"), {}),
        (None, ReadOptions(image_size=(8, 8), color_mode="grayscale"), {}),  # libpng's gray.
        (None, ReadOptions(image_size=(6, 10), crop_to_aspect_ratio=True), {}),
        (metadata(problem="detection"), None, {}),  # Batches itself.
    ],
)
def test_the_per_example_path_otherwise(meta, options, kwargs):
    assert not plan(meta, options, **kwargs).block_path


def test_whole_blocks_still_decode_on_the_per_example_path():
    augmented = plan(augment=augmentation, cache=True)
    assert augmented.raw_layout is not None and not augmented.block_path
    assert augmented.from_blocks  # Cached: the reader's blocks as they come.
    assert not augmented.places
    # Shuffled records are read by index (a stream), a batch at a time.
    assert not plan(augment=augmentation, shuffle=True).from_blocks
    assert plan(augment=augmentation, shuffle=False).from_blocks
    # Shared by example: the same record order on every reader.
    assert not plan(shard_subset=(0, 5), cache=True).from_blocks


def test_a_failing_example_is_named_only_when_examples_decode_one_by_one():
    per_example = metadata(heights=(8, 9))
    assert plan(per_example, on_invalid="raise").places
    assert not plan(per_example, on_invalid="skip").places
    assert not plan(on_invalid="raise", batch_size=None).places  # Whole blocks.


def test_sharding_by_file_when_every_reader_gets_files():
    first = plan(metadata(counts=(10, 20, 30, 40)), shard_subset=(1, 2), shuffle=True)
    assert first.sharding == read_plan.SHARD_BY_FILE
    assert first.paths == (
        "/nonexistent-cache/train-00001-of-00004.tfrecord",
        "/nonexistent-cache/train-00003-of-00004.tfrecord",
    )
    assert first.counts == (20, 40) and first.num_examples == 60
    assert first.whole and first.shuffle_files and first.block_path
    assert plan(metadata(counts=(10, 20)), shard_subset=(0, 2)).sharding == read_plan.SHARD_BY_FILE


def test_sharding_by_example_when_fewer_files_than_readers():
    shared = plan(metadata(counts=(10, 20)), shard_subset=(2, 3), shuffle=True)
    assert shared.sharding == read_plan.SHARD_BY_EXAMPLE
    assert len(shared.paths) == 2 and shared.num_examples == 30  # Every file, every reader.
    assert not shared.whole  # A share of the split: its count is not asserted.
    assert not shared.shuffle_files and shared.ordered_reads
    assert not shared.deterministic  # Unseeded: only the reading keeps its order.
    assert not shared.block_path


def test_no_sharding_without_a_shard_subset():
    whole = plan()
    assert whole.sharding == read_plan.SHARD_NONE and whole.shard_subset is None
    assert len(whole.paths) == 3 and whole.num_examples == 120 and whole.whole


def test_a_seed_makes_the_stream_deterministic_and_augmentation_one_thread():
    seeded = plan(seed=3, batch_augment=augmentation, shuffle=True)
    assert seeded.deterministic and seeded.ordered_reads
    assert seeded.augment_calls is None
    unseeded = plan(batch_augment=augmentation, shuffle=True)
    assert not unseeded.deterministic and not unseeded.ordered_reads
    assert unseeded.augment_calls == tf.data.AUTOTUNE
    assert plan(shuffle=False).deterministic  # Nothing random to repeat.


def test_a_data_service_gets_no_cache_and_no_split_count():
    served = plan(cache=True, data_service="grpc://dispatcher:5050", shuffle=True)
    assert not served.cache and not served.whole
    assert served.shuffle_files  # Uncached: the files are shuffled.
    assert served.max_blocks is None
    kept = plan(cache=True)
    assert kept.cache and kept.whole and not kept.shuffle_files  # The cache keeps one order.


def test_the_shuffle_buffer_and_the_cached_blocks_shuffled_at_once():
    assert plan().buffer == 120  # The whole of a small split.
    assert plan(metadata(counts=(3000,))).buffer == read_plan.DEFAULT_SHUFFLE_BUFFER
    assert plan(shuffle_buffer_size=7).buffer == 7
    assert plan(metadata(counts=(0,))).buffer == 1  # An empty split.
    cached = plan(cache=True)
    assert cached.block == shard_reader.COUNT_BLOCK  # No shard to measure.
    assert cached.max_blocks == 3 + 120 // cached.block
    assert plan().max_blocks is None


def test_the_last_step_runs_early_on_small_windows_when_nothing_works_on_batches(monkeypatch):
    small = plan()
    assert small.early_finish and small.windows_ahead
    assert small.finish_calls is None  # Batches of small images: one at a time.
    batch_augmented = plan(batch_augment=augmentation)
    assert not batch_augmented.early_finish and batch_augmented.windows_ahead
    # 2048 examples of 224x224x3 float pixels: over 64 MB.
    big = plan(metadata(counts=(3000,), heights=(224, 224), widths=(224, 224)),
               ReadOptions(image_size=(224, 224)))
    assert big.block_path and not big.early_finish and not big.windows_ahead
    monkeypatch.setattr(read_plan, "EARLY_FINISH_BYTES", -1)
    assert not plan().early_finish and not plan().windows_ahead
    per_example = plan(augment=augmentation)
    assert not per_example.early_finish and per_example.finish_calls == tf.data.AUTOTUNE


def test_output_dtype_and_the_interpolation_that_needs_no_clipping():
    plain = plan(options=ReadOptions(image_size=(8, 8), interpolation="area"),
                 image_dtype="uint8")
    assert plain.image_dtype == "uint8" and plain.resized_by == "area"
    assert plan(augment=augmentation).resized_by is None
    assert plan(batch_augment=augmentation).resized_by is None


def test_a_problem_that_batches_itself_counts_its_batches_on_a_whole_finite_split():
    detection = metadata(problem="detection")
    assert plan(detection).count_batches
    assert not plan(detection, repeat=True).count_batches
    assert not plan(detection, augment=augmentation).count_batches
    assert not plan(detection, data_service="grpc://dispatcher:5050").count_batches
    assert not plan().count_batches  # Plain batches keep their count.


def test_the_plan_carries_the_split_stats_and_is_frozen():
    made = plan()
    assert made.options.stored_images["raw"] == "all"
    assert made.problem.batches_itself is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.cache = True  # type: ignore[misc]


def test_shuffled_batches_of_a_whole_split_are_read_as_a_resumable_stream():
    streamed = plan(shuffle=True)
    assert streamed.stream and streamed.table.num_examples == 120
    assert not streamed.block_path and not streamed.from_blocks
    assert plan(shuffle=True, cache=True, augment=augmentation).stream
    # Read otherwise: in order, unbatched, by several workers or a service,
    # or the decoded cache of examples that vary in size.
    assert not plan().stream and plan().table is None
    assert not plan(shuffle=True, batch_size=None).stream
    assert not plan(shuffle=True, shard_subset=(0, 2)).stream
    assert not plan(shuffle=True, data_service="grpc://dispatcher:5050").stream
    assert not plan(metadata(problem="detection"), shuffle=True, cache=True).stream
    assert plan(metadata(problem="detection"), shuffle=True).stream
