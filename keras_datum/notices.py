"""Messages for the user: warnings named from the user's line, and text that
prints on any terminal.

A fixed `stacklevel` points at the user's code from one call path only: the
same export runs from `train()`, `val()`, `num_examples` or `summary()`, each
a different depth down. `warn` counts the frames inside this package instead.
"""

import os
import re
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Lone surrogates: what Python makes of the bytes of a file name that are not
# in the file system's encoding (U+DC80..U+DCFF hold bytes 0x80..0xFF).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match):
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def printable(text):
    """`text` with the undecodable bytes of file names written as `\\xNN`.

    A name such as `caf\\xe9.jpg` (Latin-1 bytes on a UTF-8 system) comes
    back from `os.listdir` holding a lone surrogate, which no terminal can
    print: a strict UTF-8 one raises, and a C locale writes the raw byte.
    Text without them is returned as it is.
    """
    text = str(text)
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(_escape_surrogate, text)


def for_stream(text, stream):
    """`printable(text)`, with what `stream`'s encoding cannot write escaped
    (`\\xe9`, `\\u2192`) rather than raising."""
    text = printable(text)
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return text
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # An encoding Python does not know.
        return text


def warn(message, category=UserWarning):
    """`warnings.warn(message)` from the first caller outside keras_datum.

    File names in `message` are escaped for the terminal (`for_stream`):
    a warning that cannot be written to stderr raises where it is issued.
    """
    frame, stacklevel = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(for_stream(message, sys.stderr), category, stacklevel=stacklevel)
