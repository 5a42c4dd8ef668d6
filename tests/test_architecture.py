"""
The layers of the house: imports among the package's modules form no cycle
and point one way, from the top (``api``, ``interop``) to the bottom
(``distributions``, ``nn``, ``data``).  Read from the source (every import,
including those inside functions), so a lazy import cannot hide a cycle.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Installed package name -> source folder (models/ and guides/ are installed inside pyro_sparse).
SOURCES = {"pyro_sparse": REPO / "pyro_sparse", "pyro_sparse.models": REPO / "models",
           "pyro_sparse.guides": REPO / "guides"}

# Rooms from the bottom up: a module may import from rooms of a lower rank
# and from its own room.  ``data``, ``nn``, ``distributions`` and the
# serialisation of files stand at the bottom; the entry points at the top.
RANKS = {
    "pyro_sparse.version": 0,
    "pyro_sparse.checks": 0,
    "pyro_sparse.plates": 1,
    "pyro_sparse.distributions": 1,
    "pyro_sparse.nn": 2,
    "pyro_sparse.data": 1,
    "pyro_sparse.io.serialization": 1,
    # FISTA is a numerical routine (numpy/torch only) that the dictionary diagnostics use.
    "pyro_sparse.baselines.fista": 1,
    "pyro_sparse.io.anndata": 2,
    "pyro_sparse.priors": 2,
    "pyro_sparse.models": 3,
    "pyro_sparse.guides": 3,
    "pyro_sparse.infer": 4,
    "pyro_sparse.evaluation": 5,
    "pyro_sparse.fitted": 6,
    "pyro_sparse.baselines": 7,
    "pyro_sparse.svi": 8,
    "pyro_sparse.registry": 9,
    "pyro_sparse.api": 10,
    "pyro_sparse.interop": 11,
    "pyro_sparse": 12,
    "pyro_sparse.__main__": 13,
}


def module_files():
    """Module name -> source file, for every module of the package."""
    modules = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def _is_ancestor(package, module):
    return module.startswith(package + ".")


def import_graph(modules):
    """Module -> the package modules it imports (a ``from package import submodule`` counts as the submodule)."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name and not _is_ancestor(t, name)}
    return graph


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan), or a module importing itself."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def room(module):
    """The longest key of RANKS that is the module or one of its packages."""
    candidates = [key for key in RANKS if module == key or _is_ancestor(key, module)]
    assert candidates, f"{module} belongs to no room of RANKS: add it"
    return max(candidates, key=len)


@pytest.fixture(scope="module")
def graph():
    return import_graph(module_files())


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_the_cycle_check_finds_an_added_cycle(graph):
    """The check can fail: an import from the bottom back to the top closes a cycle."""
    broken = {name: set(targets) for name, targets in graph.items()}
    broken["pyro_sparse.distributions.spike_and_slab"].add("pyro_sparse.api")
    found = cycles(broken)
    assert len(found) == 1 and {"pyro_sparse.api", "pyro_sparse.distributions.spike_and_slab"} <= set(found[0])


def test_imports_point_down(graph):
    upward = [
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if room(source) != room(target) and RANKS[room(target)] >= RANKS[room(source)]
    ]
    assert upward == []

