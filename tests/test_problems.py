"""The problem registry and the `Problem` contract (no export needed)."""

import pytest

from keras_datum import problems
from keras_datum.problems import base

REQUIRED = ("find_layout", "features", "encode", "decode", "to_keras")


def test_every_registered_problem_is_a_problem_with_the_required_hooks():
    assert problems.PROBLEM_NAMES == ("detection", "segmentation", "text", "classification")
    for name in problems.PROBLEM_NAMES:
        problem = problems.get(name)
        assert isinstance(problem, base.Problem) and problem.NAME == name
        for hook in REQUIRED:
            assert getattr(type(problem), hook) is not getattr(base.Problem, hook), (name, hook)


def test_the_problems_that_batch_their_own_examples_say_so():
    assert {n for n in problems.PROBLEM_NAMES if problems.get(n).batches_itself} == {
        "detection", "text"
    }


def test_the_base_hooks_are_the_documented_defaults():
    problem = base.Problem()
    with pytest.raises(NotImplementedError):
        problem.find_layout("/nowhere")
    assert problem.check_read_options({}, {}) is None
    assert problem.check_augmentation(object(), {}) is None
    assert problem.batch_count([], 4, {}) is None
    inputs = {"images": 1}
    assert problem.after_batch_augment(inputs, {}) is inputs


def test_a_fifth_problem_is_one_subclass_registered(tmp_path, monkeypatch):
    class Empty(base.Problem):
        NAME = "empty"

        def find_layout(self, root, follow_links=False):
            return None  # Recognises no folder.

    monkeypatch.setitem(problems.PROBLEMS, Empty.NAME, Empty())
    with pytest.raises(ValueError, match="Could not recognise a empty layout"):
        problems.find_layout(str(tmp_path), problem="empty")
