"""The MLX base is the packed model as MLX 4-bit (or 8-bit) affine weights: mlx-lm itself
loads it, its dequantized weights are the engine's bit for bit, and with the job's MLX
adapter applied its logits are the engine's (the engine's own forward on the packed model)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import VOCAB, save_text_model, trained_adapter_logits

from mebp_core.lora.export import export_adapter
from mebp_core.store.export_base import export_base
from mebp_core.store.export_base_common import BaseExportError
from mebp_core.store.pack import pack_model
from mebp_core.store.reader import open_store
from mebp_core.store.shipped import shipped_store_dir

mx = pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
from mlx.utils import tree_flatten  # noqa: E402

TOLERANCE = 1e-4  # relative to the largest logit; mlx sums in another order (measured ~1e-6)


def mlx_weights(mlx_dir) -> tuple[dict, dict]:
    """(every parameter mlx-lm loaded, its quantization) of the exported base."""
    model, _ = mlx_lm.load(str(mlx_dir))
    quantization = json.loads((mlx_dir / "config.json").read_text())["quantization"]
    return dict(tree_flatten(model.parameters())), quantization


def dequantized(params: dict, name: str, quantization: dict) -> np.ndarray:
    stem = name.removesuffix(".weight")
    if stem + ".scales" not in params:
        return np.array(params[name])
    return np.array(mx.dequantize(params[name], params[stem + ".scales"],
                                  params[stem + ".biases"], group_size=quantization["group_size"],
                                  bits=quantization["bits"]))


def mlx_logits(mlx_dir, adapter_dir, input_ids: torch.Tensor) -> np.ndarray:
    model, _ = mlx_lm.load(str(mlx_dir), adapter_path=str(adapter_dir))
    return np.array(model(mx.array(input_ids.numpy())).astype(mx.float32))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def assert_weights_equal(packed, mlx_dir, bits: int) -> None:
    params, quantization = mlx_weights(mlx_dir)
    assert quantization["bits"] == bits
    with open_store(packed) as store:
        assert quantization["group_size"] == store.group_size
        for name in store.names():
            quantized = name.removesuffix(".weight") + ".scales" in params
            assert quantized == (store.info(name).bits is not None), name
            want = store.dequantize(name, torch.float32).numpy()
            assert np.array_equal(dequantized(params, name, quantization), want), name


def check_adapter_parity(packed, tmp_path, dtype: str = "float32") -> tuple[float, float]:
    """(relative error of mlx-lm's adapted logits against the engine's, the adapter's own
    effect on them), the base exported as ``dtype``."""
    input_ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    ours = trained_adapter_logits(packed, input_ids, tmp_path / "adapter")[0].numpy()
    config = json.loads((packed / "config.json").read_text())
    adapter = export_adapter(tmp_path / "adapter", "mlx", tmp_path / "adapter-mlx",
                             base_config=config)
    base = export_base(packed, "mlx", tmp_path / f"base-mlx-{dtype}", dtype=dtype)
    theirs = mlx_logits(base, adapter, input_ids)[0]
    plain_model, _ = mlx_lm.load(str(base))
    plain = np.array(plain_model(mx.array(input_ids.numpy())).astype(mx.float32))[0]
    return relative_error(theirs, ours), relative_error(plain, ours)


@pytest.fixture(scope="module")
def tiny_int4(tmp_path_factory):
    return pack_model("preset:tiny", tmp_path_factory.mktemp("tiny") / "packed", quant="int4",
                      group_size=64)


def test_mlx_lm_loads_the_tiny_preset_as_4_bit_weights_equal_to_the_engines(tiny_int4,
                                                                             tmp_path):
    out = export_base(tiny_int4, "mlx", tmp_path / "base")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    assert_weights_equal(tiny_int4, out, bits=4)
    model, _ = mlx_lm.load(str(out))
    # the embeddings (tied to the head) and every projection stay quantized in mlx
    assert type(model.model.embed_tokens).__name__ == "QuantizedEmbedding"
    assert type(model.model.layers[0].mlp.down_proj).__name__ == "QuantizedLinear"


def test_the_jobs_mlx_adapter_on_the_mlx_base_gives_the_engines_logits(tiny_int4, tmp_path):
    error, adapter_effect = check_adapter_parity(tiny_int4, tmp_path)
    assert error <= TOLERANCE, error
    assert adapter_effect > 100 * TOLERANCE  # the adapter shows


def test_float16_factors_round_the_weights_in_float16(tiny_int4, tmp_path):
    """The smaller file: the packed float16 factors as they are; mlx then computes
    ``scale * q + bias`` in float16: two roundings, within two float16 epsilons of each
    tensor's largest weight (measured 1.01 on the tiny preset)."""
    out = export_base(tiny_int4, "mlx", tmp_path / "base", dtype="float16")
    params, quantization = mlx_weights(out)
    with open_store(tiny_int4) as store:
        for name in store.names():
            want = store.dequantize(name, torch.float32).numpy()
            error = np.abs(dequantized(params, name, quantization).astype(np.float32) - want)
            assert error.max() <= 2 * np.finfo(np.float16).eps * np.abs(want).max(), name
    assert (out / "model.safetensors").stat().st_size < \
        (export_base(tiny_int4, "mlx", tmp_path / "base32") / "model.safetensors").stat().st_size


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_int8_stores_and_other_families_export_exactly(model_type, tmp_path):
    source = save_text_model(tmp_path / "source", model_type)
    packed = pack_model(source, tmp_path / "packed", quant="int8", group_size=32)
    out = export_base(packed, "mlx", tmp_path / "base")
    assert_weights_equal(packed, out, bits=8)
    error, _ = check_adapter_parity(packed, tmp_path)
    assert error <= TOLERANCE, error


def test_the_shipped_pretrained_model_exports_exactly(tmp_path):
    packed = shipped_store_dir("pycode-12m")
    out = export_base(packed, "mlx", tmp_path / "base")
    assert_weights_equal(packed, out, bits=4)


def test_what_mlx_cannot_hold_is_refused(tmp_path):
    source = save_text_model(tmp_path / "source", "qwen2")
    plain = pack_model(source, tmp_path / "plain", quant="none", group_size=32)
    with pytest.raises(BaseExportError, match="stored none has none"):
        export_base(plain, "mlx", tmp_path / "a")
    small_groups = pack_model(source, tmp_path / "g16", quant="int4", group_size=16)
    with pytest.raises(BaseExportError, match="groups of"):
        export_base(small_groups, "mlx", tmp_path / "b")
    with pytest.raises(BaseExportError, match="not bfloat16"):
        export_base(small_groups, "mlx", tmp_path / "c", dtype="bfloat16")
    assert not list(tmp_path.glob("[abc]"))
