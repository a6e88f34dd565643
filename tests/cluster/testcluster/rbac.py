"""``examples/rbac.yaml`` read for the tests: its rules, and the recorded calls it does not grant.

TEST INFRASTRUCTURE (see ``apiserver.CALLS`` and ``fixtures.calls_granted_by_example_rbac``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from testcluster import REPO_ROOT
from testcluster.apiserver import rules_allow

EXAMPLE_RBAC = REPO_ROOT / "examples" / "rbac.yaml"


def example_rbac_rules(path: Path = EXAMPLE_RBAC) -> dict[str, list[dict]]:
    """``{"<kind>/<name>": rules}`` of the Roles and ClusterRoles in ``examples/rbac.yaml``."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d.get("rules") or [] for d in docs
            if d.get("kind") in ("Role", "ClusterRole")}


def ungranted_calls(calls) -> list[tuple[str, str, str, str]]:
    """The calls the code under test (``test-user``) made that ``examples/rbac.yaml`` does not grant;
    SelfSubjectAccessReviews are allowed to every user, as by a real cluster's ``system:basic-user``."""
    rules = [r for rs in example_rbac_rules().values() for r in rs]
    return sorted(c for c in calls if c[0] == "test-user" and c[2] != "selfsubjectaccessreviews"
                  and not rules_allow(rules, c[1], c[2]))

