"""The base of every error a user can fix (bad input, missing files, settings that do not fit).

Their messages name the file, line or field. The command line prints them as one line and
exits with 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class MebpError(Exception):
    """A problem with the user's input or environment, explained by the message."""

    code = "invalid_input"  # how a job that ends with it is labelled


class DivergedError(MebpError):
    """Training produced a non-finite loss or adapter weight: no adapter is written."""

    code = "training_diverged"


def out_of_space(exc: BaseException) -> bool:
    """ENOSPC (or a quota's EDQUOT) as an OSError, or as text from a writer that wraps it
    (safetensors reports "No space left on device (os error 28)")."""
    if isinstance(exc, OSError):
        return exc.errno in NO_SPACE_ERRNOS
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text or \
        any(f"os error {number}" in text for number in NO_SPACE_ERRNOS)
