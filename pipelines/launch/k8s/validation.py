"""The checks a job's manifests make before anything is built: the plan's ranks against the pool
(the spec's own Kubernetes checks are :func:`pipelines.spec.check_kubernetes`)."""

from __future__ import annotations

from typing import Any

from pipelines.core.plan import check_plan
from pipelines.spec import PoolSpec, SpecError


def plan_ranks(plan: dict[str, Any], pool: PoolSpec) -> list[dict[str, Any]]:
    """The plan's ranks in rank order; each numbered once from 0, on a device type of ``pool``, no
    type with more ranks than its ``count``."""
    ranks = check_plan(plan, pool=pool)["ranks"]
    for i, r in enumerate(ranks):
        rank = r.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise SpecError(f"plan.ranks[{i}].rank: must be an integer, got {rank!r}")
    ranks = sorted(ranks, key=lambda r: r["rank"])
    for i, r in enumerate(ranks):
        if r["rank"] != i:
            raise SpecError(
                f"plan: ranks must be numbered 0..{len(ranks) - 1}, got rank {r['rank']!r} at position {i}"
            )
        pool.get(r["device"])  # raises naming the device
    return ranks
