"""The mebp service: a FastAPI app under /v1 that calls into ``mebp_core`` (never the reverse)."""
