"""Bind an architecture to a packed store: lazy frozen projections, small tensors, LoRA."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mebp_core.config import EngineKnobs
from mebp_core.cpu import matmul_dtype
from mebp_core.engine.frozen import FrozenEmbedding, FrozenLinear, WeightWorkingSet
from mebp_core.errors import MebpError
from mebp_core.lora.linear import (
    LoraLinear,
    apply_lora,
    assign_lora_tensors,
    collect_lora_tensors,
    lora_parameters,
)
from mebp_core.lora.peft_io import (
    AdapterError,
    load_peft_adapter,
    save_peft_adapter,
)
from mebp_core.lora.spec import LoraSpec
from mebp_core.models import build_model
from mebp_core.resident import block_index, select_resident
from mebp_core.store.direct import DirectReadStore, open_direct_store
from mebp_core.store.export_base_common import base_model_name
from mebp_core.store.reader import open_store


class SourceNames:
    """Module paths of the source model: the engine runs every checkpoint as its text causal
    LM (``model.layers...``), but a multimodal Gemma 3 keeps its text model at
    ``model.language_model`` and its adapters must say so."""

    MULTIMODAL_TEXT_PREFIX = "model.language_model."

    def __init__(self, config: dict) -> None:
        self.multimodal = config.get("model_type") == "gemma3"

    def to_source(self, path: str) -> str:
        if self.multimodal and path.startswith("model."):
            return self.MULTIMODAL_TEXT_PREFIX + path.removeprefix("model.")
        return path

    def from_source(self, path: str) -> str:
        if self.multimodal and path.startswith(self.MULTIMODAL_TEXT_PREFIX):
            return "model." + path.removeprefix(self.MULTIMODAL_TEXT_PREFIX)
        return path

    def target_modules(self, spec: LoraSpec) -> str | None:
        """A PEFT regex confining the adapter to the text model (the vision tower has q_proj
        too), or None to let PEFT match the module names."""
        if not self.multimodal:
            return None
        names = "|".join(spec.hf_target_modules())
        return rf".*language_model\.layers\.\d+\..*\.({names})"


class ModelLoadError(MebpError, ValueError):
    """The packed model cannot be bound to its architecture (missing or misshapen tensor)."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class EngineModel:
    """An architecture whose frozen weights stay in the store, with LoRA branches attached."""

    store: object
    arch: nn.Module
    dtype: torch.dtype  # storage: activations, checkpoints, held weights
    knobs: EngineKnobs
    working_set: WeightWorkingSet
    matmul_dtype: torch.dtype  # what the matmuls run in (float32 on bf16 without native bf16)
    lora: dict[str, LoraLinear] = field(default_factory=dict)
    lora_spec: LoraSpec | None = None
    _contexts: dict[int, object] = field(default_factory=dict)

    @property
    def layers(self) -> nn.ModuleList:
        return self.arch.model.layers

    @property
    def config(self) -> dict:
        return self.store.config

    @property
    def shares_decompression(self) -> bool:
        """Whether the backward decompresses each block's weights once, whole."""
        return self.knobs.shares_decompression(self.matmul_dtype != self.dtype)

    def check_seq_len(self, seq_len: int) -> None:
        context = self.arch.args.max_position_embeddings
        if seq_len > context:
            raise ModelLoadError(f"--seq-len {seq_len} exceeds the model's context of {context} "
                                 "tokens (max_position_embeddings)")

    def context(self, seq_len: int):
        if seq_len not in self._contexts:
            self._contexts.clear()
            self._contexts[seq_len] = self.arch.make_context(
                seq_len, torch.device("cpu"), self.dtype, matmul_dtype=self.matmul_dtype)
        return self._contexts[seq_len]

    def block_parameters(self, block: int) -> list[nn.Parameter]:
        return [p for p in self.layers[block].parameters() if p.requires_grad]

    def lora_parameters(self) -> list[nn.Parameter]:
        return lora_parameters(self.lora)

    def adapter_tensors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return collect_lora_tensors(self.lora)

    def save_adapter(self, out: Path) -> Path:
        """The PEFT adapter, naming as its base the export of this packed model (what
        ``mebp export-base`` writes), whose weights are the ones it was trained against."""
        names = SourceNames(self.config)
        tensors = {names.to_source(path): ab for path, ab in self.adapter_tensors().items()}
        return save_peft_adapter(out, tensors, self.lora_spec,
                                 base_model_name_or_path=base_model_name(self.store.path),
                                 model_type=self.config.get("model_type"),
                                 target_modules=names.target_modules(self.lora_spec))

    def close(self) -> None:
        self.store.close()


def load_engine_model(model_dir: str | Path, *, compute_dtype: str = "float32",
                      lora_spec: LoraSpec | None = None, seed: int = 0,
                      init_adapter: str | Path | None = None,
                      knobs: EngineKnobs | None = None,
                      freeze_lora_a: bool = False) -> EngineModel:
    """Open a packed model directory and build the engine's view of it (copies no weights).
    ``freeze_lora_a`` leaves every LoRA A out of training: no gradient, no update."""
    knobs = knobs or EngineKnobs()
    dtype = DTYPES[compute_dtype]
    matmul = DTYPES[matmul_dtype(compute_dtype, knobs.bf16_matmul)]
    store = open_direct_store(model_dir, block_index) if knobs.store_reads == "direct" \
        else open_store(model_dir)
    with torch.device("meta"), _skipped_init():
        arch = build_model(store.config)
    working_set = WeightWorkingSet(weight_values=dtype)
    _bind_frozen_modules(arch, store, dtype, working_set, knobs, matmul)
    _load_small_tensors(arch, store, dtype)
    for p in arch.parameters():
        p.requires_grad_(False)
    engine = EngineModel(store, arch, dtype, knobs, working_set, matmul)
    if knobs.frozen_weights == "resident":
        lazy = _keep_weights_resident(engine, knobs.resident_weight_bytes)
        if not lazy and isinstance(store, DirectReadStore):
            store.reader.release()  # nothing is read again: no buffers to keep
    if lora_spec is not None or init_adapter is not None:
        _attach_lora(engine, lora_spec, seed, init_adapter)
        for module in engine.lora.values():
            module.store_hidden = knobs.lora_hidden == "store"
            module.matmul_dtype = matmul
            module.lora_A.weight.requires_grad_(not freeze_lora_a)
    return engine


def _keep_weights_resident(engine: EngineModel, budget_bytes: int | None) -> set[str]:
    """Decompress the frozen projections and the head that fit the budget, once; the names
    of those left to decompress on use."""
    names = [m.weight_name for m in engine.arch.modules() if isinstance(m, FrozenLinear)]
    names.append(engine.arch.head_weight_name)
    itemsize = engine.dtype.itemsize
    sizes = {name: math.prod(engine.store.info(name).shape) * itemsize for name in names}
    kept = select_resident(sizes.items(), budget_bytes)
    for name in kept:
        engine.working_set.keep_resident(engine.store, name, engine.dtype)
    return set(names) - set(kept)


@contextlib.contextmanager
def _skipped_init():
    """Skip random init while building on meta: the weights come from the store anyway, and
    the first random op on a meta tensor costs ~70 MB of torch internals for nothing."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def _bind_frozen_modules(arch: nn.Module, store, dtype: torch.dtype,
                         working_set: WeightWorkingSet, knobs: EngineKnobs,
                         matmul: torch.dtype) -> None:
    names = set(store.names())
    head = arch.head_weight_name
    for path, module in list(arch.named_modules()):
        if isinstance(module, nn.Linear):
            weight_name = f"{path}.weight"
            if weight_name not in names:
                raise ModelLoadError(f"{store.path}: tensor {weight_name!r} is missing")
            _check_shape(store, weight_name, (module.out_features, module.in_features))
            bias = None
            if module.bias is not None:
                bias = store.dequantize(f"{path}.bias", dtype)
            frozen = FrozenLinear(store, weight_name, bias, working_set=working_set,
                                  dtype=dtype, tile_bytes=knobs.decompress_tile_bytes,
                                  matmul_dtype=matmul)
            arch.set_submodule(path, frozen)
        elif isinstance(module, nn.Embedding):
            weight_name = f"{path}.weight"
            _check_shape(store, weight_name, (module.num_embeddings, module.embedding_dim))
            arch.set_submodule(path, FrozenEmbedding(store, weight_name, dtype=dtype))
    if head not in names:
        raise ModelLoadError(f"{store.path}: output projection {head!r} is missing")


def _load_small_tensors(arch: nn.Module, store, dtype: torch.dtype) -> None:
    """Norm weights and other small tensors are read into memory (a few KB per block)."""
    names = set(store.names())
    for path, tensor in [*arch.named_parameters(), *arch.named_buffers()]:
        if not tensor.is_meta:
            continue
        if path not in names:
            raise ModelLoadError(f"{store.path}: tensor {path!r} is missing")
        _check_shape(store, path, tuple(tensor.shape))
        value = store.dequantize(path, dtype)
        owner_path, _, leaf = path.rpartition(".")
        owner = arch.get_submodule(owner_path)
        if leaf in owner._parameters:
            owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
        else:
            owner._buffers[leaf] = value


def _attach_lora(engine: EngineModel, spec: LoraSpec | None, seed: int,
                 init_adapter: str | Path | None) -> None:
    loaded = None
    if init_adapter is not None:
        adapter_spec, loaded = load_peft_adapter(init_adapter)
        names = SourceNames(engine.config)
        loaded = {names.from_source(path): ab for path, ab in loaded.items()}
        spec = _reconcile_specs(spec, adapter_spec, init_adapter)
    engine.lora = apply_lora(engine.arch, spec, seed=seed)
    engine.lora_spec = spec
    if loaded is None:
        return
    try:
        assign_lora_tensors(engine.lora, loaded)
    except AdapterError as exc:
        raise AdapterError(f"{init_adapter}: {exc}") from exc


def _reconcile_specs(spec: LoraSpec | None, adapter_spec: LoraSpec, source) -> LoraSpec:
    """An initial adapter must agree with the requested rank and alpha; targets may grow, and
    the adapter's scaling rule (rsLoRA or not) carries over."""
    if spec is None:
        return adapter_spec
    for field_name, flag in (("rank", "--lora-rank"), ("alpha", "--lora-alpha")):
        ours, theirs = getattr(spec, field_name), getattr(adapter_spec, field_name)
        if ours != theirs:
            raise AdapterError(f"{source}: adapter has {field_name} {theirs}, "
                               f"but {flag} is {ours}")
    return spec.model_copy(update={"use_rslora": adapter_spec.use_rslora})


def _check_shape(store, name: str, expected: tuple[int, ...]) -> None:
    actual = tuple(store.info(name).shape)
    if actual != tuple(expected):
        raise ModelLoadError(
            f"{store.path}: tensor {name!r} has shape {actual}, the config implies {expected}")

