"""The base exports a model can be downloaded as, for a job's storage: each with the bytes
of its weights predicted from the model's shapes (before anything is packed), the made
file's size once kept, and whether a worker is making it. The API lists them
(``GET /v1/models/{name}/base/formats``) and the job page links them."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from app.api.base_downloads import GGUF_BLOCKS_STORE, base_request
from app.model_schemas import BaseExportPublic
from mebp_core.store.export_base_common import BaseExportError
from mebp_core.store.export_size import export_weight_bytes, source_specs
from service.base_export_queue import BaseExports
from service.bases import BaseRequest

# (format, dtype, GGUF block type): every export a model may have, smallest-first within
# a format; the float32 ones are the packed weights dequantized, exactly
EXPORT_VARIANTS = (("hf", "float32", None), ("hf", "float16", None), ("hf", "bfloat16", None),
                   ("gguf", "float32", None), ("gguf", "float16", None),
                   ("gguf", "float32", "q8_0"), ("gguf", "float32", "q4_1"),
                   ("mlx", "float32", None), ("mlx", "float16", None))
EXACT_VARIANTS = {("hf", "float32"), ("gguf", "float32"), ("gguf", "q4_1"),
                  ("mlx", "mlx-float32")}


def query_quant(base: BaseRequest) -> str:
    """The ``quant`` query parameter that asks for ``base``."""
    return base.gguf_quant or base.quant


def download_url(name: str, base: BaseRequest) -> str:
    query = urlencode({"format": base.fmt, "quant": query_quant(base),
                       "group_size": base.group_size, "dtype": base.dtype})
    return f"/v1/models/{quote(name)}/base?{query}"


def list_base_exports(exports: BaseExports, name: str, source: str, config: dict, *,
                      quant: str, group_size: int,
                      variants=EXPORT_VARIANTS) -> list[BaseExportPublic]:
    """The exports of ``variants`` the model stored ``quant`` / ``group_size`` can be written
    as, in that order (GGUF blocks only of an int4 store: what ``quant=q4_1|q8_0`` asks for)."""
    specs = source_specs(source)
    listed = []
    for fmt, dtype, gguf_quant in variants:
        if gguf_quant is not None and quant != GGUF_BLOCKS_STORE:
            continue
        try:
            base = base_request(source, config, fmt=fmt, quant=gguf_quant or quant,
                                group_size=group_size, dtype=dtype)
        except BaseExportError:
            continue
        kept_bytes = exports.kept_bytes(base)
        status = "kept" if kept_bytes is not None else \
            exports.progress(base) or "not_exported"
        listed.append(BaseExportPublic(
            format=fmt, quant=query_quant(base), group_size=group_size, dtype=dtype,
            exact=(fmt, base.variant) in EXACT_VARIANTS,
            predicted_bytes=export_weight_bytes(specs, quant=base.quant, group_size=group_size,
                                                fmt=fmt, dtype=dtype, gguf_quant=gguf_quant),
            bytes=kept_bytes, status=status, url=download_url(name, base)))
    return listed
