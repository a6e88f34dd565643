"""The device pool: the device types a job may use, and how a rank gets one of each.

A pool file (``examples/pool-local.yaml``) is a :class:`PoolSpec`.  Only pydantic and the
standard library are imported (the Airflow side reads pools while parsing DAG files).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from pipelines.spec import kube
from pipelines.spec.base import FieldError, SpecError, Strict, field_error

__all__ = ["LocalDevice", "KubernetesDevice", "DeviceType", "PoolSpec"]

NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


class LocalDevice(Strict):
    """How the local launcher makes a device of this type on one machine: the rank is pinned to CPU
    cores and capped by a cgroup CFS quota, the mechanism behind a pod's CPU limit, so the kernel
    really slows a small share down."""

    cpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="CPU cores a rank of this type is pinned to (empty: any core)."
    )
    cpu_share: float = Field(
        1.0, gt=0, le=64,
        description="CPU quota in cores (0.4 = 40% of one core). A share that covers all the pinned cores sets "
        "no quota: the pinning already limits the rank, and a quota equal to the cores still throttles on "
        "accounting slack.",
    )
    cpu_period_ms: float = Field(
        100.0, ge=1, le=1000,
        description="CFS period of the quota in ms. The default, the kubelet's 100 ms, makes a local device behave "
        "like a pod's CPU limit: a 40% device runs at full speed for 40 ms, then stops for 60 ms, so a "
        "synchronous step that lands in the stop waits for all of it. A short period such as 10 makes it "
        "uniformly slow, like a slower accelerator.",
    )


class KubernetesDevice(Strict):
    """How a pod of this type is requested from Kubernetes."""

    resources: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "1", "memory": "2Gi"},
        description='Requests, set equal to limits, e.g. {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}. '
        "Names and quantities follow Kubernetes (400m, 4Gi, 64G; not 64GB), and extended resources such as "
        "nvidia.com/gpu are whole numbers. Ranks of a type that requests a GPU (nvidia.com/gpu or any */gpu) "
        "run kubernetes.gpu_image.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="The pod's nodeSelector: node labels it must match, passed as given."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="The pod's tolerations (Kubernetes Toleration objects), passed as given."
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="The pod's affinity (a Kubernetes Affinity object), passed as given."
    )

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, str]) -> dict[str, str]:
        problems = [(name, p) for name, value in v.items() if (p := kube.resource_problem(name, value))]
        if problems:
            raise FieldError(*problems)
        return v


class DeviceType(Strict):
    """One type of device: how many the pool has, what each offers, and how a rank gets one."""

    name: str = Field(
        description="Lower-case name, unique in the pool (a DNS label of at most 40 characters: pods carry it in "
        "their device_type label), e.g. a100, t4."
    )
    count: int = Field(
        ge=1, description="How many devices of this type the pool has; a plan may not put more ranks on the type."
    )
    memory_gb: float = Field(
        gt=0, description="Memory per device that a rank can use, in GB; a rank's batch is capped to fit in 80% of it."
    )
    power_watts: float = Field(gt=0, description="Power a device draws while training, for the energy objective.")
    cost_per_hour: float = Field(ge=0, description="Price per device-hour, for the cost objective.")
    local: LocalDevice = Field(default_factory=LocalDevice)
    kubernetes: KubernetesDevice = Field(default_factory=KubernetesDevice)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v):
            raise field_error(
                f"{v!r} must be a lower-case DNS label of at most 40 characters (a-z, 0-9, '-', starting and "
                "ending with a letter or digit): pods carry it in their device_type label"
            )
        return v

    @property
    def requests_gpu(self) -> bool:
        """True when a pod of this type asks Kubernetes for a GPU (``nvidia.com/gpu`` or any ``*/gpu``)."""
        return kube.requests_gpu(self.kubernetes.resources)


class PoolSpec(Strict):
    """The device types a job may use (a pool file)."""

    device_types: list[DeviceType] = Field(min_length=1, description="The pool's device types, names unique.")

    @model_validator(mode="after")
    def _unique(self) -> PoolSpec:
        names = [d.name for d in self.device_types]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"device type names must be unique, repeated: {dupes}")
        return self

    def get(self, name: str) -> DeviceType:
        for d in self.device_types:
            if d.name == name:
                return d
        raise SpecError(f"device type {name!r} is not in the pool (have {[d.name for d in self.device_types]})")
