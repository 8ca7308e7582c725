"""A graph that keeps less than autograd would: a tensor it would save is kept as its layout
and made again when the backward reads it (``torch.autograd.graph.saved_tensors_hooks``;
nested hooks replace outer ones within the scope)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def remade_when_read(made: torch.Tensor, remake: Callable[[], torch.Tensor], *,
                     unchanged: torch.Tensor | None = None):
    """Hooks under which whatever the graph saves on ``made``'s storage (``made`` or a view of
    it) is kept as its layout, and ``remake()`` (the same bits as ``made``) is viewed that way
    when the backward reads it. ``unchanged``: a tensor ``remake`` reads, refused at the
    backward if changed in place since (autograd's own rule for what it saves)."""
    storage = made.untyped_storage().data_ptr()

    def pack(saved: torch.Tensor):
        if saved.untyped_storage().data_ptr() != storage:
            return saved
        version = None if unchanged is None else unchanged._version
        return _Layout(saved.shape, saved.stride(), saved.storage_offset(), version)

    def unpack(packed):
        if not isinstance(packed, _Layout):
            return packed
        if unchanged is not None and unchanged._version != packed.version:
            raise RuntimeError("a tensor needed for a gradient, and kept in place of one "
                               "made from it, was modified by an in-place operation")
        return remake().as_strided(packed.shape, packed.stride, packed.offset)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@dataclass(frozen=True)
class _Layout:
    """What the graph keeps in place of a saved tensor: its view, and the version of the
    tensor it is remade from."""

    shape: torch.Size
    stride: tuple[int, ...]
    offset: int
    version: int | None
