"""Training data: tokenizers, JSONL reading, packing and batching. Import the submodules:
only batching needs torch, and the API checks uploads without it."""
