"""The layering rules of docs/ARCHITECTURE.md ("Layout and layering"), checked without running code:

1. ``pipelines`` never imports airflow;
2. a stage package (``pipelines/<stage>/``) never imports another stage's package;
3. ``dags/``, ``plugins/`` and every ``pipelines`` module they import while Airflow parses the DAG
   (module-level imports, followed transitively; Airflow imports every file in ``plugins/``) import
   no heavy library at module level;
4. no import circle among the modules of ``pipelines/`` and ``plugins/``, counting imports inside
   functions too (a lazy import hides a circle, it does not remove it); importing a submodule is an
   edge to that submodule's file, not to its package's ``__init__``;
5. no file in ``pipelines/`` or ``plugins/`` is longer than :data:`MAX_LINES` lines.

Exit status 1 and one line per violation when a rule is broken. Needs no third-party package.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"tensorflow", "horovod", "pyarrow", "scipy", "numpy", "matplotlib", "pandas"}
STAGE_PACKAGES = ("preload", "estimate", "lr_search", "train", "publish", "analyze", "promote")
# Top-level import names of the project's own code, and the folder each lives in.
SOURCES = {"pipelines": "", "hetero": "plugins"}
MAX_LINES = 500


def imported_modules(tree: ast.AST, module_level_only: bool) -> list[tuple[int, str]]:
    """(line, module) of each absolute import; ``from a import b`` also yields ``a.b`` (b may be
    a submodule: :func:`module_file` keeps only names that are files)."""
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def module_file(module: str, root: Path) -> Path | None:
    """The project file that defines ``module`` (a module or a package's ``__init__``), if any."""
    top = module.split(".")[0]
    if top not in SOURCES:
        return None
    base = root / SOURCES[top] / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def with_parents(module: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def parse_time_files(root: Path) -> dict[Path, str]:
    """Every project file that runs when Airflow parses the DAG, with why (the importer)."""
    start = [p for folder in ("dags", "plugins") for p in sorted((root / folder).rglob("*.py"))]
    seen: dict[Path, str] = {p: "itself" for p in start}
    queue = list(start)
    while queue:
        path = queue.pop()
        for _, mod in imported_modules(ast.parse(path.read_text()), module_level_only=True):
            for name in with_parents(mod):
                target = module_file(name, root)
                if target is not None and target not in seen:
                    seen[target] = f"imported by {path.relative_to(root)}"
                    queue.append(target)
    return seen


def stage_of(path: Path, root: Path) -> str | None:
    rel = path.relative_to(root).parts
    return rel[1] if len(rel) > 2 and rel[0] == "pipelines" and rel[1] in STAGE_PACKAGES else None


def import_graph(root: Path) -> dict[Path, set[Path]]:
    """Each project file of ``pipelines/`` and ``plugins/`` and the project files it imports
    (anywhere in it): ``from a.b import c`` is an edge to ``a/b/c.py`` when that file exists, else
    to ``a.b``'s file."""
    files = [p for folder in ("pipelines", "plugins") for p in sorted((root / folder).rglob("*.py"))]
    graph: dict[Path, set[Path]] = {}
    for path in files:
        edges = graph.setdefault(path, set())
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [module_file(a.name, root) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = module_file(node.module, root)
                targets = [module_file(f"{node.module}.{a.name}", root) or base for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t is not None and t != path)
    return graph


def import_circles(root: Path) -> list[list[Path]]:
    """The strongly connected components of more than one file (Tarjan), each as a cycle through
    them, in a stable order."""
    graph = import_graph(root)
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    components: list[list[Path]] = []

    def visit(node: Path) -> None:
        # Recursion depth is bounded by the number of project files (a few hundred).
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle(c, graph) for c in sorted(components)]


def _cycle(component: list[Path], graph: dict[Path, set[Path]]) -> list[Path]:
    """One cycle through a component, from its first file back to it (breadth-first, shortest)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return component


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted((root / "pipelines").rglob("*.py")):
        own = stage_of(path, root)
        for line, mod in imported_modules(ast.parse(path.read_text()), module_level_only=False):
            parts = mod.split(".")
            where = f"{path.relative_to(root)}:{line}"
            if parts[0] == "airflow":
                out.append(f"{where}: pipelines must not import airflow ({mod})")
            elif parts[0] == "pipelines" and len(parts) > 1 and parts[1] in STAGE_PACKAGES and own not in (None, parts[1]):
                out.append(f"{where}: stage {own!r} must not import stage {parts[1]!r} ({mod}); "
                           "move what both need to a shared module")
    for path, why in parse_time_files(root).items():
        for line, mod in imported_modules(ast.parse(path.read_text()), module_level_only=True):
            if mod.split(".")[0] in HEAVY:
                reason = "" if why == "itself" else f" (parsed with the DAG: {why})"
                out.append(f"{path.relative_to(root)}:{line}: heavy import at module level ({mod}){reason}")
    for cycle in import_circles(root):
        names = " -> ".join(str(p.relative_to(root)) for p in cycle)
        out.append(f"{cycle[0].relative_to(root)}: import circle: {names}; move what both need to a module "
                   "that imports neither")
    for folder in ("pipelines", "plugins"):
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                out.append(f"{path.relative_to(root)}: {lines} lines, more than {MAX_LINES}; split it by what "
                           "it holds")
    return sorted(set(out))


if __name__ == "__main__":
    problems = violations()
    print("\n".join(problems) or "layering ok")
    sys.exit(1 if problems else 0)
