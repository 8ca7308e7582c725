"""A configuration's knobs in words, for the people choosing one in the explorer."""

from __future__ import annotations

from mebp_core.units import MB


def describe_knobs(knobs: dict, method: str = "mebp") -> str:
    """``EngineKnobs`` as JSON -> one sentence: "weights decompressed per projection as
    they are used, every block's input checkpointed in RAM, ...". MeZO keeps no activations
    and plain backprop's knobs are fixed, so each method is said in its own terms."""
    if method == "mezo":
        return _mezo(knobs)
    if method == "backprop":
        return ("one autograd graph over the whole model and the full logits, every frozen "
                "weight decompressed once and kept in RAM")
    parts = [_weights(knobs), _checkpoints(knobs),
             "the LoRA hidden state kept for the backward" if knobs["lora_hidden"] == "store"
             else "the LoRA hidden state recomputed in the backward"]
    if knobs["checkpoint_blocks"] != "none":
        tiles = f"weights decompressed in tiles of {knobs['decompress_tile_bytes'] / MB:g} MB"
        parts.append({True: "a block's weights decompressed once for its whole backward",
                      False: tiles,
                      "auto": "a block's weights decompressed once for its whole backward "
                              f"where matmuls run in its dtype, else {tiles}"}[
                          knobs["share_decompression"]])
    parts += _mlp_chunks(knobs) + _store_reads(knobs)
    return ", ".join(parts)


def _store_reads(knobs: dict) -> list[str]:
    if knobs.get("store_reads") == "direct":
        return ["the store read directly a block ahead into two staging buffers (no page "
                "cache)"]
    return []


def _mezo(knobs: dict) -> str:
    parts = ["two forward passes with a seeded perturbation and no backward", _weights(knobs)]
    if knobs["frozen_weights"] != "resident" or knobs.get("resident_weight_bytes") is not None:
        parts.append(f"weights decompressed in tiles of {knobs['decompress_tile_bytes'] / MB:g} MB")
    parts += _mlp_chunks(knobs) + _store_reads(knobs)
    return ", ".join(parts)


def _mlp_chunks(knobs: dict) -> list[str]:
    if knobs.get("mlp_chunk_tokens"):
        return [f"the MLP run {knobs['mlp_chunk_tokens']} tokens at a time"]
    if knobs.get("mlp_intermediate_chunk"):
        return [f"the MLP run {knobs['mlp_intermediate_chunk']} intermediate columns at a "
                "time over every token"]
    return []


def _weights(knobs: dict) -> str:
    if knobs["frozen_weights"] != "resident":
        return "frozen weights decompressed from the store as they are used"
    budget = knobs.get("resident_weight_bytes")
    if budget is None:
        return "every frozen weight decompressed once and kept in RAM"
    return f"{budget / MB:.0f} MB of frozen weights kept decompressed, the rest decompressed " \
           "as used"


def _checkpoints(knobs: dict) -> str:
    every = knobs["checkpoint_blocks"]
    if every == "none":
        return "no checkpoints: one autograd graph over the whole model"
    where = "in RAM" if knobs["checkpoint_storage"] == "ram" else \
        "in a memory-mapped file (reclaimable page cache)"
    blocks = "every block's input" if every == 1 else f"every {every}th block's input"
    tail = knobs.get("graph_tail_blocks")
    if tail:
        return f"the last {tail} blocks in one autograd graph (kept, not recomputed), " \
               f"before them {blocks} checkpointed {where}"
    return f"{blocks} checkpointed {where}"
