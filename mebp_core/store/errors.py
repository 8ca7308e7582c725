"""Errors raised by the packed weight store."""

from __future__ import annotations

from mebp_core.errors import MebpError


class StoreError(MebpError):
    """A packed store cannot be read or a tensor in it cannot be served."""


class StoreFormatError(StoreError):
    """A ``model.mebp`` file is not a valid store: wrong magic, unknown version, truncated."""


class PackError(StoreError):
    """A source checkpoint cannot be packed."""


class QuantizationError(MebpError, ValueError):
    """A tensor cannot be quantized with the requested bits or group size."""
