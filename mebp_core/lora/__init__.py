"""LoRA with PEFT's semantics, the MeSP backward, and PEFT adapter I/O.

Import from the submodules: the package itself imports nothing, so ``spec`` (and the training
config built on it) stays torch-free.
"""
