"""Fail if the pipelines package imports airflow, or if dags/ or plugins/ import heavy libraries at
module level (ruff's TID253 checks the latter too; this script needs no ruff)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"tensorflow", "horovod", "pyarrow", "scipy", "numpy", "matplotlib", "pandas"}


def imported_modules(tree: ast.AST, module_level_only: bool) -> list[tuple[int, str]]:
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted((root / "pipelines").rglob("*.py")):
        for line, mod in imported_modules(ast.parse(path.read_text()), module_level_only=False):
            if mod.split(".")[0] == "airflow":
                out.append(f"{path.relative_to(root)}:{line}: pipelines must not import airflow ({mod})")
    for folder in ("dags", "plugins"):
        for path in sorted((root / folder).rglob("*.py")):
            for line, mod in imported_modules(ast.parse(path.read_text()), module_level_only=True):
                if mod.split(".")[0] in HEAVY:
                    out.append(f"{path.relative_to(root)}:{line}: heavy import at module level ({mod})")
    return out


if __name__ == "__main__":
    problems = violations()
    print("\n".join(problems) or "layering ok")
    sys.exit(1 if problems else 0)
