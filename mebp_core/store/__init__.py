"""The packed weight store: quantization, the ``model.mebp`` format, packing, mmap reading.

The store owns the bytes; the engine asks for tensors by their Hugging Face name.

Import from the submodules: the package itself imports nothing, so torch-free code (the
planner, the service) can read ``preset_configs`` without loading torch.
"""
