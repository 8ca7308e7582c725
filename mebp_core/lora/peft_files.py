"""The files of an adapter directory in PEFT's format, by name only: the service reads and
moves them without importing torch (``peft_io`` reads and writes their contents)."""

from mebp_core.errors import MebpError

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_FILES = frozenset({CONFIG_NAME, WEIGHTS_NAME})


class AdapterError(MebpError, ValueError):
    """An adapter directory is unreadable, not LoRA, inconsistent, or does not fit a model."""
