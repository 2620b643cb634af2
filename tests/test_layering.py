"""The packages form layers that follow the data flow: a package imports only itself and lower layers, and no
module takes part in an import cycle. Every import counts, including those inside functions: a lazy import is
still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS: list[set[str]] = [
    {"common"},  # the input-error type and option checks
    {"traces"},  # requests, lengths, arrivals
    {"policies"},  # pure scheduling decisions, plans, KV accounting
    {"serving"},  # the replica loop, inbox, bookkeeping, records
    {"sim"},  # catalogue, cost models, SimPy, metrics, capacity, outputs
    {"executor"},  # torch: the model, the ragged executor, runtime settings
    {"profiler", "engine"},  # siblings: neither imports the other
    {"simctl"},  # the command line
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
THIRD_PARTY = {"torch": {"executor", "profiler", "engine"}, "transformers": {"executor", "profiler", "engine"},
               "simpy": {"sim"}}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYER:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from pkg import module` names a module too
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if f"{node.module}.{a.name}" in MODULES]
    return found


def test_every_package_is_layered() -> None:
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "notebooks"}
    assert on_disk <= set(LAYER), f"packages missing from the layer table: {sorted(on_disk - set(LAYER))}"


def test_packages_import_only_lower_layers() -> None:
    bad = []
    for name, path in MODULES.items():
        pkg = name.split(".")[0]
        for line, mod in _imports(path):
            top = mod.split(".")[0]
            if top in LAYER and top != pkg and LAYER[top] >= LAYER[pkg]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod} (layer {LAYER[top]} >= {LAYER[pkg]})")
            if top in THIRD_PARTY and pkg not in THIRD_PARTY[top]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    graph = {name: sorted({mod for _, mod in _imports(path) if mod in MODULES and mod != name})
             for name, path in MODULES.items()}
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"
