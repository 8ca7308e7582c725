"""Federated fine-tuning over LoRA: how rows are split across devices, which devices take part
in a round, and how their adapters are combined. Pure functions of their inputs and a seed,
so a restarted coordinator makes the same choices."""
