"""Check the import layering of the project's packages without importing them.

Every ``.py`` under the given packages (default ``costmodel``, ``sim``, ``experiments``,
lowest layer first) is parsed with ``ast``; nothing is imported or executed. From the
parse trees it builds the graph of module-level imports between project modules (an
import in a function body runs when the function is called, not when the module loads,
so those are listed apart; an ``if TYPE_CHECKING:`` block never runs and is skipped) and
reports:

(a) import cycles among module-level imports: each strongly connected component of the
    graph with more than one module (or a module importing itself), with one cycle through
    it spelled out. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so
    those count as imported too, except the importer's own packages (already loading);
(b) imports up the layering: a package importing a package listed after it (``costmodel``
    importing ``sim`` or ``experiments``, ``sim`` importing ``experiments``), module-level
    or function-local; inside a package with an inner order (``SUBLAYERS``: sim's folders,
    ``workloads < capture < predict < place < distributed``, then ``sim.api``), a folder
    importing one listed after it;
(c) function-local imports of project modules (information: they often hide a cycle, so
    the cycles the graph would have if they ran at import time are counted beside them).

The exit status is 1 when (a) or (b) found something, else 0. ``--json`` prints the
report as JSON instead of text.

Usage: ``python scripts/check_layering.py [--root DIR] [--json] [PACKAGE ...]``
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_PACKAGES = ("costmodel", "sim", "experiments")
#: inner order of a package's folders, lowest first; its modules outside them (``sim.api``,
#: ``sim.__main__``) rank above every folder
SUBLAYERS: dict[str, tuple[str, ...]] = {"sim": ("workloads", "capture", "predict", "place", "distributed")}


@dataclass(frozen=True)
class Import:
    """One import of a project module: who imports what, where."""

    importer: str  # dotted module name of the importing file
    target: str  # dotted module name imported
    path: str  # file of the importer, relative to the root
    line: int
    local: bool  # inside a function body (runs on call, not on import)


@dataclass
class Report:
    modules: list[str]
    imports: list[Import]
    cycles: list[list[str]] = field(default_factory=list)  # one cycle per strongly connected component
    hidden_cycles: list[list[str]] = field(default_factory=list)  # the same, function-local imports included
    hidden_sizes: list[int] = field(default_factory=list)  # modules per such component
    upward: list[Import] = field(default_factory=list)
    local: list[Import] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.cycles and not self.upward


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_imports(node: ast.AST, local: bool):
    """(import node, inside a function?) for every import under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, local
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk_imports(child, True)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:  # the else branch runs
                yield from _walk_imports(ast.Module(body=[sub], type_ignores=[]), local)
        else:
            yield from _walk_imports(child, local)


def _resolve(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]) -> list[str]:
    """Project modules an import statement loads (the most specific existing module per name)."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    targets: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if (t := known(alias.name)) is not None:
                targets.append(t)
        return targets
    if node.level:
        base_parts = importer.split(".")
        if not is_package:
            base_parts = base_parts[:-1]
        base_parts = base_parts[: len(base_parts) - (node.level - 1)] if node.level > 1 else base_parts
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    for alias in node.names:
        full = f"{base}.{alias.name}" if base else alias.name
        t = full if full in modules else known(base)
        if t is not None and t not in targets:
            targets.append(t)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path of module names) per strongly connected component, sorted."""
    return sorted(_cycle_in(graph, comp) for comp in _components(graph))


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components that hold a cycle (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1 or node in graph.get(node, ()):
                        components.append(sorted(comp))
    return components


def _cycle_in(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest closed path through the first module of a strongly connected component."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child in members and child not in seen:
                    seen.add(child)
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _rank(module: str, rank: dict[str, int]) -> tuple[int, int]:
    """(package rank, folder rank inside the package) of a module."""
    parts = module.split(".")
    inner = SUBLAYERS.get(parts[0], ())
    if len(parts) == 1:
        sub = len(inner)  # the package's __init__
    else:
        sub = inner.index(parts[1]) if parts[1] in inner else len(inner)
    return rank[parts[0]], sub


def analyse(root: Path, packages: tuple[str, ...] = DEFAULT_PACKAGES) -> Report:
    """Parse every ``.py`` of ``packages`` under ``root`` and check their imports."""
    root = Path(root).resolve()
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            files[module_name(path, root)] = path
    modules = set(files)
    rank = {p: i for i, p in enumerate(packages)}
    imports: list[Import] = []
    for name, path in sorted(files.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, local in _walk_imports(tree, False):
            for target in _resolve(node, name, is_package, modules):
                if target != name or not is_package:
                    imports.append(Import(name, target, str(path.relative_to(root)), node.lineno, local))
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if not imp.local:
            graph[imp.importer].add(imp.target)
            # importing a.b.c first runs a/__init__ and a/b/__init__; the importer's own
            # packages are already loading when it runs, so only the others count
            own = _ancestors(imp.importer) | {imp.importer}
            graph[imp.importer].update(p for p in _ancestors(imp.target) if p in modules and p not in own)
    report = Report(sorted(modules), imports)
    report.cycles = _cycles(graph)
    full = {m: set(t) for m, t in graph.items()}
    for imp in imports:
        if imp.local and imp.target != imp.importer:
            full[imp.importer].add(imp.target)
    report.hidden_cycles = _cycles(full)
    report.hidden_sizes = sorted((len(c) for c in _components(full)), reverse=True)
    for imp in imports:
        if _rank(imp.target, rank) > _rank(imp.importer, rank):
            report.upward.append(imp)
        if imp.local:
            report.local.append(imp)
    return report


def render(report: Report) -> str:
    lines = [f"{len(report.modules)} modules, {sum(not i.local for i in report.imports)} module-level "
             f"and {len(report.local)} function-local project imports"]
    lines.append(f"(a) import cycles among module-level imports: {len(report.cycles)}")
    lines += [f"    {' -> '.join(c)}" for c in report.cycles]
    lines.append(f"(b) imports up the layering: {len(report.upward)}")
    lines += [f"    {i.path}:{i.line} {i.importer} -> {i.target}{' (function-local)' if i.local else ''}"
              for i in report.upward]
    lines.append(f"(c) function-local imports of project modules: {len(report.local)}")
    lines += [f"    {i.path}:{i.line} {i.importer} -> {i.target}" for i in report.local]
    sizes = report.hidden_sizes
    lines.append(f"    with them at import time the graph would have {len(report.hidden_cycles)} cycle(s)"
                 + (f" (strongly connected components of {', '.join(map(str, sizes))} modules)" if sizes else ""))
    lines.append("OK" if report.ok else "FAILED: cycles or upward imports")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", default=list(DEFAULT_PACKAGES),
                        help="top-level packages, lowest layer first (default: %(default)s)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the directory holding the packages (default: the repository)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = analyse(args.root, tuple(args.packages))
    if args.json:
        print(json.dumps({"cycles": report.cycles, "hidden_cycles": report.hidden_cycles, "upward": [asdict(i) for i in report.upward],
                          "local": [asdict(i) for i in report.local], "ok": report.ok}, indent=1))
    else:
        print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
