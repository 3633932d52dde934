"""Problem types: each module owns its source layouts, label features and `(x, y)`.

A problem module defines a subclass of `base.Problem` (the hooks the
export, the cache and the read path call, with their defaults) and one
instance of it, `PROBLEM`, registered in `PROBLEMS` below. Adding a problem
type is writing one module and adding it there (see docs/architecture.md).
`labels` is no problem: it holds the label code the problems share.
"""

import os

from keras_datum import sources
from keras_datum.problems import classification
from keras_datum.problems import detection
from keras_datum.problems import segmentation
from keras_datum.problems import text

# Detection order matters: the distinctive layouts are tried first, and the
# class-folder layout, which accepts any folder of subfolders, last.
PROBLEMS = {
    module.NAME: module.PROBLEM for module in (detection, segmentation, text, classification)
}
PROBLEM_NAMES = tuple(PROBLEMS)
# Each problem-specific option, and the problems (in registry order) it applies to.
PROBLEM_OPTIONS = {
    option: tuple(name for name, problem in PROBLEMS.items() if option in problem.OPTIONS)
    for problem in PROBLEMS.values()
    for option in problem.OPTIONS
}


def get(name):
    """The registered `base.Problem` of that name."""
    return PROBLEMS[name]


def find_layout(root, problem=None, follow_links=False, unlabelled=False):
    """Detects the problem type and layout of `root` (with `unlabelled`, the
    layouts `label_mode=None` reads: see `Problem.find_unlabelled_layout`).

    Raises:
        ValueError: when no problem type recognises the folder.
    """
    candidates = [PROBLEMS[problem]] if problem else list(PROBLEMS.values())
    with sources.collector_paused():
        for candidate in candidates:
            find = candidate.find_unlabelled_layout if unlabelled else candidate.find_layout
            layout = find(root, follow_links=follow_links)
            if layout is not None:
                _check_class_names(layout, root)
                _check_training_examples(layout, root)
                return layout
    reason = PROBLEMS[problem].why_not(root, follow_links) if problem else None
    if reason is not None:
        raise ValueError(f"{reason} See docs/layouts.md for the folder trees keras_datum reads.")
    raise ValueError(
        f"Could not recognise a {problem or 'known'} layout in {root!r}. "
        "See docs/layouts.md for the folder trees keras_datum reads."
    )


def _check_training_examples(layout, root):
    """A layout that lists no training example (an empty `train.json`, a
    COCO file without images) is named here, before any work."""
    if not layout.splits.get("train"):
        found = ", ".join(f"{len(records)} {split}" for split, records in layout.splits.items())
        raise ValueError(
            f"{root!r} lists no training examples (as a {layout.problem} source "
            f"in the {layout.name!r} layout{': ' + found if found else ''}). "
            "See docs/layouts.md for the folder trees keras_datum reads."
        )


def _check_class_names(layout, root):
    """Class names are written as UTF-8 (metadata, TFDS label files): a
    folder named in another encoding (`caf\\xe9` from an old zip) is named
    here instead of failing the export halfway."""
    for name in layout.info.get("class_names", []):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(name)
            raise ValueError(
                f"The class name {raw!r} in {root!r} is not valid UTF-8 (a folder "
                f"named in another encoding, perhaps {raw.decode('latin-1')!r}). "
                "Rename it."
            ) from None
