"""A script of bench/ loaded as a module (bench/ is not a package), for the benchmarks' unit tests.
A plain module, not a conftest: test modules elsewhere import their own ``conftest`` by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str):
    """``load_bench("checkpoint")``: bench/checkpoint.py as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
