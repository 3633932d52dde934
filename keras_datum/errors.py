"""The errors that refuse one source example at export.

`InvalidExampleError` is raised by whatever reads one example (an image,
a mask, a text file) and says why it cannot be used; the export
reports it as an invalid file, or raises it with `on_invalid="raise"`.
`InvalidImageError` is the kind for a file that is not a usable image.

This module imports nothing: the export's workers, threads or forked
processes, raise these without TensorFlow.
"""


class InvalidExampleError(ValueError):
    """A source example that cannot be used; the message says why."""


class InvalidImageError(InvalidExampleError):
    """A source file that cannot be used as an image; the message says why."""
