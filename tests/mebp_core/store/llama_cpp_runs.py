"""llama.cpp itself (llama-cpp-python, built from its PyPI sdist by ``make test``) on an
exported GGUF base: the logits it computes, with or without a GGUF adapter, and their error
against ours. Importing it skips the test module where llama-cpp-python is not built."""

from __future__ import annotations

import numpy as np
from built_by_make import import_built

llama_cpp = import_built("llama_cpp", "llama-cpp")

# a float32 KV cache, asked for: llama.cpp's default is float16, which alone costs ~2e-4
F32 = llama_cpp.GGML_TYPE_F32


def llama_cpp_logits(base, input_ids: list[int], adapter=None) -> np.ndarray:
    model = llama_cpp.Llama(model_path=str(base), lora_path=None if adapter is None
                            else str(adapter), n_ctx=64, n_batch=64, logits_all=True,
                            n_threads=1, verbose=False, type_k=F32, type_v=F32)
    try:
        model.eval(input_ids)
        return np.array(model.scores[:len(input_ids)])
    finally:
        model.close()


def relative_error(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())
