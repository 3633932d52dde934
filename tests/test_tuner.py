"""A real KerasTuner search over a DatumDataset: one export, honoured batch sizes."""

import importlib.util
import math
import os
import shutil

import keras
import keras_tuner
import pytest

from keras_datum import export
from keras_datum.demo import make_shapes_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_example():
    path = os.path.join(ROOT, "examples", "tuner_search.py")
    spec = importlib.util.spec_from_file_location("tuner_search", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StepCounter(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


@pytest.mark.slow
def test_two_trials_export_once_and_honour_batch_size(tmp_path, monkeypatch):
    example = _load_example()
    exports = []
    real_export = export.export_layout

    def counting_export(*args, **kwargs):
        exports.append(args[2])
        return real_export(*args, **kwargs)

    monkeypatch.setattr(export, "export_layout", counting_export)
    source = make_shapes_dataset(str(tmp_path / "shapes"), images_per_class=20, image_size=32)
    # A fourth class: the example's model takes its outputs from the dataset.
    shutil.copytree(os.path.join(source, "circle"), os.path.join(source, "star"))
    trials = []

    class RecordingHyperModel(example.DatumHyperModel):
        def fit(self, hp, model, *args, **kwargs):
            counter = StepCounter()
            kwargs["callbacks"] = [*kwargs.get("callbacks", []), counter]
            history = super().fit(hp, model, *args, **kwargs)
            trials.append((hp.get("batch_size"), counter.steps))
            return history

    hypermodel = RecordingHyperModel(source, image_size=32, cache_dir=str(tmp_path / "cache"))
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="val_accuracy",
        max_trials=2,
        directory=str(tmp_path / "tuner"),
        project_name="t",
        seed=3,
    )
    tuner.search(epochs=1, verbose=0)
    assert len(tuner.oracle.trials) == 2
    assert [t.status for t in tuner.oracle.trials.values()] == ["COMPLETED"] * 2
    assert tuner.get_best_models(1)[0].output_shape == (None, 4)
    assert exports == [str(tmp_path / "cache")]
    train_examples = hypermodel.dataset().num_examples["train"]
    assert len(trials) == 2
    for batch_size, steps in trials:
        assert steps == math.ceil(train_examples / batch_size)
