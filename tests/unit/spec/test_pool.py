"""The pool model (pipelines.spec.pool): the example pools load, bad device types name the field,
resources follow the Kubernetes rules."""

from __future__ import annotations

import pytest

from pipelines.spec import SpecError, load_pool
from spec.documents import DEVICE, pool_doc


def test_example_pools_load():
    local = load_pool("examples/pool-local.yaml")
    assert [d.name for d in local.device_types] == ["fast", "slow"]
    assert local.get("slow").local.cpu_share == pytest.approx(0.4)
    gpu = load_pool("examples/pool-gpu.yaml")
    assert gpu.get("a100").kubernetes.resources["nvidia.com/gpu"] == "1"
    with pytest.raises(SpecError, match="device type 'h100' is not in the pool"):
        gpu.get("h100")


def test_bad_pool_names_the_field(tmp_path):
    f = tmp_path / "pool.yaml"
    f.write_text("device_types:\n  - {name: Fast_GPU, count: 0, memory_gb: 1, power_watts: 1, cost_per_hour: 0}\n")
    with pytest.raises(SpecError) as e:
        load_pool(f)
    assert "device_types.0.name" in str(e.value) and "device_types.0.count" in str(e.value)
    f.write_text("device_types:\n  - {name: a, count: 1, memory_gb: 1, power_watts: 1, cost_per_hour: 0}\n"
                 "  - {name: a, count: 1, memory_gb: 1, power_watts: 1, cost_per_hour: 0}\n")
    with pytest.raises(SpecError, match=r"repeated: \['a'\]"):
        load_pool(f)


@pytest.mark.parametrize(
    "resources, message",
    [
        ({"cpu": "1", "memory": "64GB"}, r"device_types\.0\.kubernetes\.resources\.memory: '64GB' is not a Kubernetes quantity"),
        ({"cpu": "1", "memory": "4gi"}, r"resources\.memory: '4gi' is not a Kubernetes quantity"),
        ({"cpu": "four", "memory": "4Gi"}, r"resources\.cpu: 'four' is not a Kubernetes quantity"),
        ({"cpu": "-1", "memory": "4Gi"}, r"resources\.cpu: '-1' is not a Kubernetes quantity"),
        ({"cpu": "1", "memory": ""}, r"resources\.memory: '' is not a Kubernetes quantity"),
        ({"cpu": "1", "nvidia.com/gpu": "0.5"}, r"resources\.nvidia\.com/gpu: '0\.5': an extended resource \(nvidia\.com/gpu\) must be a whole number"),
        ({"cpu": "1", "gpu": "1"}, r"resources\.gpu: 'gpu' is not a resource name: use cpu, memory"),
    ],
)
def test_pool_resources_follow_the_kubernetes_quantity_rule(resources, message):
    with pytest.raises(SpecError, match=message):
        load_pool(pool_doc(**resources))


def test_pool_resources_name_every_bad_entry():
    with pytest.raises(SpecError) as e:
        load_pool(pool_doc(cpu="8 cores", memory="64GB"))
    assert "2 invalid field(s)" in str(e.value)
    assert "resources.cpu: '8 cores'" in str(e.value) and "resources.memory: '64GB'" in str(e.value)


@pytest.mark.parametrize(
    "resources",
    [
        {"cpu": "400m", "memory": "4Gi", "nvidia.com/gpu": "1"},
        {"cpu": "8", "memory": "64G", "ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"},
        {"cpu": "0.5", "memory": "1e9", "amd.com/gpu": "2"},
        {"cpu": "+1.5", "memory": "512Mi", "example.com/fpga": "1k"},
    ],
)
def test_valid_pool_resources_load(resources):
    assert load_pool(pool_doc(**resources)).get("a100").kubernetes.resources == resources


def test_device_names_are_label_values():
    with pytest.raises(SpecError, match=r"device_types\.0\.name: 'x{41}' must be a lower-case DNS label of at most 40"):
        load_pool({"device_types": [{**DEVICE, "name": "x" * 41}]})
    with pytest.raises(SpecError, match=r"device_types\.0\.name: 'a100-' .*device_type label"):
        load_pool({"device_types": [{**DEVICE, "name": "a100-"}]})


def test_gpu_requests_are_recognised():
    pool = load_pool(pool_doc(cpu="1", **{"nvidia.com/gpu": "1"}))
    assert pool.get("a100").requests_gpu
    assert not load_pool(pool_doc(cpu="1", **{"nvidia.com/gpu": "0"})).get("a100").requests_gpu
    assert load_pool(pool_doc(cpu="1", **{"amd.com/gpu": "2"})).get("a100").requests_gpu
    assert not load_pool(pool_doc(cpu="1", memory="4Gi")).get("a100").requests_gpu
