"""The contract of a problem type: what the export, the cache and the read path call.

Each problem module (classification, detection, segmentation, text) defines
a subclass of `Problem` whose methods are its functions, and registers one
instance in `problems/__init__.py`. The shared machinery calls only these
methods; a hook a problem does not need keeps its default here.
"""

import dataclasses

# The read options of every image problem: set on a text dataset, they
# would do nothing.
IMAGE_OPTIONS = (
    "image_size", "color_mode", "interpolation", "crop_to_aspect_ratio",
    "pad_to_aspect_ratio", "max_image_side",
)


class Problem:
    """A problem type's hooks.

    Attributes:
        NAME: the name used in `DatumDataset(problem=...)` and the metadata.
        batches_itself: whether `batch` replaces plain `batch` (ragged or
            padded boxes, bucketed texts): its examples then never take the
            read path's whole-batch decoding.
        OPTIONS: the `DatumDataset` arguments that apply to this problem
            only (or to a few): set away from their defaults on a dataset of
            another type, they are refused (see `config.read_options_for`).
        PAD_TO_ASPECT_RATIO: the default of `pad_to_aspect_ratio`.
    """

    NAME = ""
    batches_itself = False
    OPTIONS: tuple = ()
    PAD_TO_ASPECT_RATIO = False

    # Whether every decoded example has fixed shapes (no box list, no text):
    # a resumable stream's decoded cache keeps only those.
    fixed_examples = True

    def batches_in_order(self, options):
        """Whether `batch` keeps the examples' order, so that each batch is
        the run of positions a resumable stream counts (see `streams`)."""
        return True

    def read_defaults(self, options):
        """`options` (a `config.ReadOptions`) with this problem's defaults
        in place of the ones left to it."""
        if options.pad_to_aspect_ratio is None:
            return dataclasses.replace(options, pad_to_aspect_ratio=self.PAD_TO_ASPECT_RATIO)
        return options

    def find_layout(self, root, follow_links=False):
        """A `sources.Layout`, or `None` when `root` is not of this type.

        Raises:
            ValueError: `root` is of this type but broken.
        """
        raise NotImplementedError

    def find_unlabelled_layout(self, root, follow_links=False):
        """The layout read with `label_mode=None`: the problem's own by
        default. Classification and text read every file below `root`
        instead of class folders, as Keras does with `labels=None`."""
        return self.find_layout(root, follow_links=follow_links)

    def why_not(self, root, follow_links=False):
        """Why `root` is not of this type, when `find_layout` found nothing
        and the user asked for this type; `None` for the generic message."""
        return

    def features(self, info):
        """The JSON feature spec of everything an example stores."""
        raise NotImplementedError

    def encode(self, record, options):
        """`(features, stats)` of one `ExampleRecord`, read and validated
        (`options`: the export options). Runs in export workers.

        Raises:
            errors.InvalidExampleError: the example cannot be used.
        """
        raise NotImplementedError

    def decode(self, parsed, info, options, seed=None):
        """The KerasCV-style dict (`{"images": ..., "labels": ...}`) of one
        parsed example (graph code). `seed`: the example's crop seed, with
        `options.random_resized_crop` (see `crop`); image problems decode
        its window then."""
        raise NotImplementedError

    def to_keras(self, inputs):
        """The `(x, y)` (or `x`) handed to Keras, from an example or a batch."""
        raise NotImplementedError

    def check_read_options(self, info, options):
        """Raises `ValueError` for read options this dataset cannot honour."""

    def check_augmentation(self, augmentation, options):
        """Raises `ValueError` for a step that cannot handle this problem's data."""

    def check_split(self, split, split_info, options, augmentations):
        """Warns about what reading `split` as asked would lose."""

    def batch(self, dataset, batch_size, options):
        """Batches examples when plain `batch` does not fit them (see
        `batches_itself`); `batch_size` may be None."""
        return dataset if batch_size is None else dataset.batch(batch_size)

    def batch_count(self, paths, batch_size, options):
        """The number of batches `batch` makes of a split, or None if unknown."""
        return

    def after_batch_augment(self, inputs, options):
        """A batch as `batch` makes it, again after `batch_augment`."""
        return inputs
