"""neuron-precompile: neuron_parallel_compile around the training command (see commands.py)."""

from __future__ import annotations

from llmpipe.backends.neuron.commands import main as _main


def main(argv: list[str] | None = None) -> None:
    _main(argv, "precompile")
