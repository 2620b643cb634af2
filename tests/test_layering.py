"""The packages under the one import root `simctl` form layers that follow the data flow: a package
imports only itself and lower layers, and no module takes part in an import cycle. Every import counts,
including those inside functions: a lazy import is still a dependency. The command line's modules sit in
`simctl` itself, the top layer. The engine imports nothing of the simulator (`APART`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS: list[set[str]] = [
    {"common"},  # the input-error type, option checks, a user's paths
    {"traces"},  # requests, lengths, arrivals
    {"policies"},  # pure scheduling decisions, plans, KV accounting
    {"catalogue"},  # published model shapes (dense, MoE) and accelerator specs
    {"serving"},  # the replica loop, inbox, bookkeeping, records, the KV link
    {"costs"},  # what an iteration costs: roofline, fitted models, step overheads
    {"results"},  # a run's records, metrics, a deployment's summary, SLOs, saturation, all-or-nothing files
    {"sim"},  # SimPy: the driver, clusters, one run from names
    {"studies"},  # many runs: capacity, goodput, sweeps, the papers' experiments
    {"plots"},  # figures of runs, studies and fits
    {"executor"},  # torch: the model, the ragged executor, runtime settings
    {"engine"},  # the real-execution mode: simctl's engine and the real vLLM as targets
    {"profiler"},  # timing shapes and fitting them; served vLLM's steps through the engine's server
    {"validation"},  # real runs against their simulated twins
    {"simctl"},  # the command line: the modules of `simctl` itself
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
THIRD_PARTY = {"torch": {"executor", "profiler", "engine"},
               "transformers": {"executor", "profiler", "engine"}, "simpy": {"sim"}}
# lower layers a package must not import all the same: the real engine runs on the monotonic clock and shares
# with the simulator only what lies below both (serving, results), so it imports nothing of SimPy's driver
APART = {"engine": {"sim"}}


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted((ROOT / "simctl").rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The layered package of a module of simctl ("simctl.sim.run" -> "sim"; the CLI's "simctl.run_cmd" ->
    "simctl"), or the top-level name of any other module ("numpy.linalg" -> "numpy")."""
    parts = module.split(".")
    if parts[0] != "simctl":
        return parts[0]
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else "simctl"


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the module `name` (at `path`), at any depth; relative ones
    resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            found.append((node.lineno, module))
            # `from pkg import module` names a module too
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names
                      if f"{module}.{a.name}" in MODULES]
    return found


def test_relative_imports_resolve(tmp_path: Path) -> None:
    # the project has none today; one added later must not slip past the checks
    (tmp_path / "m.py").write_text("from .fitted import Fitted\nfrom .. import capacity\n")
    assert _imports("simctl.studies.sub.m", tmp_path / "m.py") == [
        (1, "simctl.studies.sub.fitted"), (2, "simctl.studies"), (2, "simctl.studies.capacity")]


def test_every_package_is_layered() -> None:
    on_disk = {p.parent.name for p in (ROOT / "simctl").glob("*/__init__.py")}
    assert on_disk <= set(LAYER), f"packages missing from the layer table: {sorted(on_disk - set(LAYER))}"


def test_one_import_root() -> None:
    # what `pip install` adds to site-packages: the packages pyproject.toml's find rule includes
    import tomllib

    from setuptools import find_namespace_packages

    rule = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    installed = find_namespace_packages(str(ROOT), **rule["packages"]["find"])
    assert installed and {p.split(".")[0] for p in installed} == {"simctl"}
    assert not [p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in {"simctl", "tests"}]


def test_packages_import_only_lower_layers() -> None:
    bad = []
    for name, path in MODULES.items():
        pkg = _package(name)
        for line, mod in _imports(name, path):
            top = _package(mod)
            if top in LAYER and top != pkg and LAYER[top] >= LAYER[pkg]:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line} imports {mod} (layer {LAYER[top]} >= {LAYER[pkg]})")
            if top in THIRD_PARTY and pkg not in THIRD_PARTY[top]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
            if top in APART.get(pkg, ()):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod} ({pkg} keeps apart from {top})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    lines = {(name, mod): line for name, path in MODULES.items() for line, mod in _imports(name, path)
             if mod in MODULES and mod != name}
    graph: dict[str, list[str]] = {name: [] for name in MODULES}
    for name, mod in sorted(lines):
        graph[name].append(mod)
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
    assert not cycles, "import cycles, each with the imports that close it:\n" + "\n".join(
        f"{c}: " + "; ".join(f"{MODULES[a].relative_to(ROOT)}:{lines[a, b]} imports {b}"
                             for a in c for b in graph[a] if b in c) for c in cycles)
