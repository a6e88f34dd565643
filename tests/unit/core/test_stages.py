"""The stages' shared pieces (pipelines.core.stages): the inputs a run carries."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipelines.core.stages import run_inputs

ROOT = Path(__file__).resolve().parents[3]


def test_a_relative_pool_is_read_under_the_base():
    assert run_inputs("examples/pool-local.yaml", base=ROOT)["pool"] == yaml.safe_load(
        (ROOT / "examples" / "pool-local.yaml").read_text()
    )
