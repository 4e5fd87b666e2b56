"""The package's layers depend one way: core <- engine <- executor/worker/model <- benchmark <- simulator <-
entrypoints (the top-level modules such as config.py and sampling_params.py sit with core; sarathi/__init__,
which re-exports `LLM`, with the entrypoints). Imports are read from the source (AST, lazy imports inside
functions included), not by grep.

Nothing imports a higher layer, no modules import each other in a circle, and `sarathi/core` and
`sarathi/engine` import no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "sarathi"
LAYERS = {"core": 0, "engine": 1, "executor": 2, "worker": 2, "model": 2}
LAYERS |= {"benchmark": 3, "simulator": 4, "entrypoints": 5}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return 5
    return LAYERS.get(parts[1], 0)


def _imports() -> dict[str, set[str]]:
    """Each sarathi module -> the sarathi modules (and torch) it imports anywhere in its source."""
    modules = {_module(p) for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        targets = graph.setdefault(_module(path), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from sarathi.x import y` imports module sarathi.x.y if it is one
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
    return {
        m: {t for t in ts if t.startswith("sarathi") or t.split(".")[0] == "torch"} for m, ts in graph.items()
    }


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected sets of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_no_upward_import() -> None:
    graph = _imports()
    upward = {
        (a, b) for a, bs in graph.items() for b in bs if b.startswith("sarathi") and _layer(b) > _layer(a)
    }
    assert upward == set(), "imports against the layer order"


def test_no_torch_in_core_or_engine() -> None:
    torchy = {
        m for m, ts in _imports().items() if _layer(m) <= 1 and any(t.split(".")[0] == "torch" for t in ts)
    }
    assert torchy == set()


def test_no_import_circle() -> None:
    graph = {m: {t for t in ts if t.startswith("sarathi")} for m, ts in _imports().items()}
    assert [sorted(c) for c in _circles(graph)] == []


def test_the_walk_sees_lazy_imports_and_circles() -> None:
    """The checks above would pass vacuously if the walk missed imports inside functions."""
    graph = _imports()
    assert "sarathi.simulator.machine_profile" in graph["sarathi.entrypoints.workload_args"]  # a lazy import
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
