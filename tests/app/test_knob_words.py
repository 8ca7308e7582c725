"""A configuration's knobs in words: what the explorer says of the chosen one."""

from __future__ import annotations

from app.web.knob_words import describe_knobs
from mebp_core.config import EngineKnobs


def words(method: str = "mebp", **knobs) -> str:
    return describe_knobs(EngineKnobs(**knobs).model_dump(mode="json"), method)


def test_direct_reads_are_said_and_mapped_ones_are_not():
    for method in ("mebp", "mezo"):
        assert "read directly" not in words(method)
        said = words(method, store_reads="direct")
        assert "the store read directly a block ahead" in said
        assert said.startswith(words(method))  # the rest said as before


def test_each_knob_changes_the_sentence():
    base = words()
    for knobs in (dict(frozen_weights="resident"), dict(checkpoint_blocks=2),
                  dict(checkpoint_storage="mmap"), dict(lora_hidden="store"),
                  dict(graph_tail_blocks=3), dict(mlp_intermediate_chunk=128),
                  dict(share_decompression=False)):
        assert words(**knobs) != base, knobs
