"""The images install what the lock files pin: same TensorFlow, Horovod, Python and Airflow versions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _pin(lock: str, package: str) -> str:
    match = re.search(rf"^{re.escape(package)}==([^\s;]+)", (ROOT / "requirements" / lock).read_text(), re.M)
    assert match, f"requirements/{lock}: no pin for {package}"
    return match.group(1)


def _horovod_version() -> str:
    match = re.search(r"horovod==([\d.]+)", (ROOT / "requirements" / "trainer.in").read_text())
    assert match, "requirements/trainer.in: no horovod version noted"
    return match.group(1)


def _arg(text: str, name: str) -> str | None:
    match = re.search(rf"^ARG {name}=(\S+)", text, re.M)
    return match.group(1) if match else None


@pytest.mark.parametrize("name", ["Dockerfile.trainer", "Dockerfile.trainer-gpu"])
def test_trainer_images_install_the_trainer_lock_and_build_horovod(name):
    text = (DOCKER / name).read_text()
    assert "requirements/trainer.lock" in text and re.search(
        r"pip install -r /tmp/trainer(-gpu)?\.lock", text
    )
    assert _arg(text, "HOROVOD_VERSION") == _horovod_version()
    assert "horovod==${HOROVOD_VERSION}" in text and "--no-build-isolation" in text
    for flag in (
        "HOROVOD_WITH_TENSORFLOW=1",
        "HOROVOD_WITH_GLOO=1",
        "HOROVOD_WITHOUT_MPI=1",
        "HOROVOD_WITHOUT_PYTORCH=1",
        "HOROVOD_WITHOUT_MXNET=1",
    ):
        assert flag in text, f"{name}: {flag} missing"
    assert "python3.11" in text or "python:3.11" in text
    assert re.search(r"^USER 10001", text, re.M), f"{name}: must run as uid 10001"
    assert 'ENTRYPOINT ["python", "-m", "pipelines"]' in text


def test_the_cpu_image_takes_tensorflow_from_the_lock():
    text = (DOCKER / "Dockerfile.trainer").read_text()
    assert not re.search(r"tensorflow(-cpu)?==", text), (
        "the CPU image must not pin TensorFlow apart from the lock"
    )
    assert _pin("trainer.lock", "tensorflow-cpu") == "2.15.1"


def test_the_gpu_image_swaps_in_tensorflow_and_cuda_of_the_same_version():
    text = (DOCKER / "Dockerfile.trainer-gpu").read_text()
    assert _arg(text, "TENSORFLOW_VERSION") == _pin("trainer.lock", "tensorflow-cpu")
    assert '"tensorflow[and-cuda]==${TENSORFLOW_VERSION}"' in text
    assert "grep -v '^tensorflow-cpu=='" in text  # every other pin comes from the lock
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in text
    assert re.search(r"^FROM \$\{CUDA_(DEVEL|RUNTIME)\}", text, re.M) and "nvidia/cuda:12" in text


def test_the_airflow_image_uses_the_airflow_lock_version():
    text = (DOCKER / "Dockerfile.airflow").read_text()
    version = _pin("airflow.lock", "apache-airflow")
    assert _arg(text, "AIRFLOW_VERSION") == version
    assert "apache/airflow:${AIRFLOW_VERSION}-python3.11" in text
    assert "requirements/airflow.lock" in text and "-r /tmp/airflow.lock" in text
    assert "COPY --chown=airflow:0 dags /opt/airflow/dags" in text and "plugins /opt/airflow/plugins" in text
    code = "\n".join(line for line in text.lower().splitlines() if not line.startswith("#"))
    assert "tensorflow" not in code and "horovod" not in code
