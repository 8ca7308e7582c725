"""``mebp bench``: mebp beside mezo, plain backprop and transformers + PEFT.

- ``side_by_side``: memory and s/step per method, each in a fresh process (``worker``).
- ``convergence``: validation loss against steps and wall-clock, mebp vs mezo, on
  ``corpus`` (the docstrings of Python's standard library).
- ``command``: ``add_bench_arguments(parser)`` and ``run_bench(args)`` for the CLI.
"""

from mebp_core.bench.command import add_bench_arguments, run_bench

__all__ = ["add_bench_arguments", "run_bench"]
