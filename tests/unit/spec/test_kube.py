"""The Kubernetes API's rules (pipelines.spec.kube)."""

from __future__ import annotations

from pipelines.spec.kube import parse_quantity


def test_quantities_are_read_as_kubernetes_does():
    assert [float(parse_quantity(q)) for q in ("400m", "4Gi", "64G", "1e3", ".5")] == [0.4, 4 * 2**30, 64e9, 1000, 0.5]
