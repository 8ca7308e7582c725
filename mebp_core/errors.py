"""The base of every error a user can fix (bad input, missing files, settings that do not fit).

Their messages name the file, line or field. The command line prints them as one line and
exits with 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MebpError(Exception):
    """A problem with the user's input or environment, explained by the message."""

    code = "invalid_input"  # how a job that ends with it is labelled


class DivergedError(MebpError):
    """Training produced a non-finite loss or adapter weight: no adapter is written."""

    code = "training_diverged"
