"""Shared fixtures for the Kubernetes tests (Airflow environment, no cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; so do the tests
    sys.path.insert(0, str(ROOT / "plugins"))
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from k8s_support import GPU_POOL  # noqa: E402


@pytest.fixture
def spec_doc() -> dict:
    return {
        "dataset": {"uri": "/data/shapes"},
        "pool": GPU_POOL,
        "launcher": "kubernetes",
        "artifact_root": "/mnt/artifacts",
        "training": {"global_batch": 256},
        "kubernetes": {
            "namespace": "ml",
            "artifact_volume_claim": "hetero-artifacts",
            "secret_name": "s3-credentials",
            "scheduling_timeout_s": 60,
            "image_pull_timeout_s": 120,
            "gpu_image": "hetero-pipelines-trainer:0.1.0-gpu",  # the GPU pool's ranks
        },
    }


@pytest.fixture
def mixed_plan() -> dict:
    """Three ranks on three GPU generations with unequal batches."""
    return {
        "global_batch": 224,
        "ranks": [
            {"rank": 0, "device": "a100", "batch": 128, "samples_per_sec": 900.0, "max_batch": 512},
            {"rank": 1, "device": "v100", "batch": 64, "samples_per_sec": 450.0, "max_batch": 256},
            {"rank": 2, "device": "t4", "batch": 32, "samples_per_sec": 220.0, "max_batch": 256},
        ],
    }
