"""Documents the spec tests load: a minimal job, a Kubernetes job, a pool of one device type."""

GOOD = {"dataset": {"uri": "/data/shapes"}}
K8S = {"launcher": "kubernetes", "artifact_root": "/mnt/artifacts", "kubernetes": {"artifact_volume_claim": "artifacts"}}
DEVICE = {"name": "a100", "count": 2, "memory_gb": 40, "power_watts": 400, "cost_per_hour": 3.0}
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"


def k8s_doc(**kubernetes) -> dict:
    """A job for launcher kubernetes, with these ``kubernetes`` fields."""
    return {**GOOD, **K8S, "kubernetes": {**K8S["kubernetes"], **kubernetes}}


def pool_doc(**resources) -> dict:
    """A pool of one device type (:data:`DEVICE`) requesting these Kubernetes resources."""
    return {"device_types": [{**DEVICE, "kubernetes": {"resources": resources}}]}
