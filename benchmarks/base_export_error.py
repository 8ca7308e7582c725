"""How far each exported base is from the packed weights the adapter was trained against,
and how far llama.cpp's and mlx-lm's logits (base + the adapter) are from the engine's.

    .venv/bin/python benchmarks/base_export_error.py [--model preset:tiny] \\
        [--model mebp_core/store/shipped/pycode-12m] [--per-tensor]

Weights: every tensor of the GGUF as gguf's reader dequantizes it (bit for bit ggml's), and
of the MLX base as ``mx.dequantize`` does, against the engine's float32 dequantization: the
largest absolute error, that over the largest weight (relative), and the root mean square
relative error. Logits: relative to the largest logit, 24 tokens, an adapter with every LoRA
B non-zero (rank 4, all projections). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "tests" / "mebp_core" / "store"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tiny_models import trained_adapter_logits  # noqa: E402

from mebp_core.lora.export import export_adapter  # noqa: E402
from mebp_core.store.export_base import export_base  # noqa: E402
from mebp_core.store.export_error import (  # noqa: E402
    TensorError,
    gguf_base_errors,
    overall_error,
)
from mebp_core.store.reader import open_store  # noqa: E402
from mebp_core.store.resolve import resolve_model  # noqa: E402

GGUF_VARIANTS = [("gguf f32", "float32", None), ("gguf f16", "float16", None),
                 ("gguf q8_0", "float32", "q8_0"), ("gguf q4_1", "float32", "q4_1")]
MLX_VARIANTS = [("mlx float32 factors", "float32"), ("mlx float16 factors", "float16")]


def mlx_errors(mlx_dir: Path, store) -> list[TensorError]:
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten

    model, _ = mlx_lm.load(str(mlx_dir))
    params = dict(tree_flatten(model.parameters()))
    quantization = json.loads((mlx_dir / "config.json").read_text())["quantization"]
    errors = []
    for name in store.names():
        stem = name.removesuffix(".weight")
        if stem + ".scales" in params:
            got = np.array(mx.dequantize(params[name], params[stem + ".scales"],
                                         params[stem + ".biases"], **quantization))
        else:
            got = np.array(params[name])
        ours = store.dequantize(name, torch.float32).numpy().astype(np.float64)
        diff = got.astype(np.float64) - ours
        errors.append(TensorError(name, "Q" if stem + ".scales" in params else "kept",
                                  float(np.abs(diff).max()), float(np.abs(ours).max()),
                                  float((diff * diff).sum()), float((ours * ours).sum()),
                                  ours.size))
    return errors


def llama_cpp_error(base: Path, adapter: Path, ids: list[int], ours: np.ndarray) -> float:
    import llama_cpp

    model = llama_cpp.Llama(model_path=str(base), lora_path=str(adapter), n_ctx=64,
                            n_batch=64, logits_all=True, n_threads=1, verbose=False,
                            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        model.eval(ids)
        theirs = np.array(model.scores[:len(ids)])
    finally:
        model.close()
    return float(np.abs(theirs - ours).max() / np.abs(ours).max())


def mlx_lm_error(base: Path, adapter: Path, input_ids: torch.Tensor, ours: np.ndarray) -> float:
    import mlx.core as mx
    import mlx_lm

    model, _ = mlx_lm.load(str(base), adapter_path=str(adapter))
    theirs = np.array(model(mx.array(input_ids.numpy())).astype(mx.float32))[0]
    return float(np.abs(theirs - ours).max() / np.abs(ours).max())


def measure(model: str, work: Path, per_tensor: bool) -> list[str]:
    packed = Path(model) if Path(model).is_dir() else resolve_model(model, quant="int4",
                                                                    group_size=64)
    vocab = json.loads((packed / "config.json").read_text())["vocab_size"]
    input_ids = torch.randint(0, min(vocab, 256), (1, 24),
                              generator=torch.Generator().manual_seed(0))
    ours = trained_adapter_logits(packed, input_ids, work / "adapter")[0].numpy()
    config = json.loads((packed / "config.json").read_text())
    gguf_adapter = export_adapter(work / "adapter", "gguf", work / "adapter.gguf",
                                  base_config=config)
    mlx_adapter = export_adapter(work / "adapter", "mlx", work / "adapter-mlx",
                                 base_config=config)
    rows, details = [], []
    with open_store(packed) as store:
        for label, dtype, gguf_quant in GGUF_VARIANTS:
            out = export_base(packed, "gguf", work / f"{label}.gguf", dtype=dtype,
                              gguf_quant=gguf_quant)
            errors = gguf_base_errors(out, store)
            logits = llama_cpp_error(out, gguf_adapter, input_ids[0].tolist(), ours)
            rows.append(row(label, out.stat().st_size, errors, logits))
            details += [row(f"{label} {e.name}", None, [e], None) for e in errors]
        for label, dtype in MLX_VARIANTS:
            out = export_base(packed, "mlx", work / label, dtype=dtype)
            errors = mlx_errors(out, store)
            logits = mlx_lm_error(out, mlx_adapter, input_ids, ours)
            size = sum(p.stat().st_size for p in out.iterdir())
            rows.append(row(label, size, errors, logits))
    header = [f"\n{model} (`{packed.name}`)\n",
              "| export | bytes | max abs error | relative (overall) | worst tensor's relative "
              "| rms relative | logits with adapter, relative |",
              "|---|---|---|---|---|---|---|"]
    return header + rows + (details if per_tensor else [])


def row(label: str, size: int | None, errors: list[TensorError], logits: float | None) -> str:
    total = overall_error(label, errors)
    worst = max(e.relative_error for e in errors)
    return (f"| {label} | {'' if size is None else f'{size:,}'} | {total.max_abs_error:.3g} "
            f"| {total.relative_error:.3g} | {worst:.3g} | {total.rms_relative_error:.3g} "
            f"| {'' if logits is None else f'{logits:.2g}'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="preset:NAME or a packed directory")
    parser.add_argument("--per-tensor", action="store_true")
    args = parser.parse_args()
    for model in args.model or ["preset:tiny", str(REPO / "mebp_core/store/shipped/pycode-12m")]:
        with tempfile.TemporaryDirectory() as work:
            print("\n".join(measure(model, Path(work), args.per_tensor)), flush=True)


if __name__ == "__main__":
    main()
