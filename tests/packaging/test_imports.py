"""No import circles in loopnet: the graph of which loopnet module imports which has no cycle; and loopnet never
imports `experiments` (the studies' readers, which build on it one way).

The graph is read from the source with `ast`, every module the package holds (whatever files exist),
and counts every import statement wherever it stands:

* module level, inside functions (lazy imports) and under `if TYPE_CHECKING:` alike. A lazy import
  only moves a circle from import time to call time; the two modules still depend on each other, so
  neither can be read, tested or moved without the other.
* `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`; when `pkg`'s
  `__init__` defers `name` through `loopnet.lazy.lazy_attributes` (PEP 562), the edge goes on to the
  module that defines it, as the import does at run time.
* The `__init__` of a module's parent packages, which Python runs before the module, is not an edge
  of its own (as in pydeps and import-linter): a package's `__init__` counts through what it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "loopnet"


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file, for every module of `package` under `root` (a package is its `__init__`)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def lazy_names(tree: ast.Module, package: str) -> dict[str, str]:
    """Name -> defining module of a package `__init__` that hands its names out through
    `lazy_attributes(__name__, WHERE)`, WHERE a literal dict of name -> (relative) module."""
    tables = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    out = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "lazy_attributes"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Name)
            and node.args[1].id in tables
        ):
            for name, where in ast.literal_eval(tables[node.args[1].id]).items():
                out[name] = package + where if where.startswith(".") else where
    return out


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for what counts)."""
    files = modules(root, package)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in files.items()}
    lazy = {name: lazy_names(tree, name) for name, tree in trees.items() if files[name].name == "__init__.py"}

    def target(name: str) -> str | None:  # the module itself, else its nearest enclosing module of ours
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, tree in trees.items():
        here = name if files[name].name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [target(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{anchor}.{base}" if base else anchor
                found = []
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in files:
                        found.append(full)
                    elif alias.name in lazy.get(base, {}):
                        found += [base, target(lazy[base][alias.name])]
                    else:
                        found.append(target(base))
            else:
                continue
            graph[name] |= {m for m in found if m is not None and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:  # the package's graph is a few hundred nodes deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    """One circle through `component`: `a -> b -> ... -> a` (a shortest path back to its first module)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return " -> ".join([*paths[v], start])
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return " <-> ".join(component)


def test_the_graph_reads_every_module_and_its_imports():
    graph = import_graph()
    assert set(graph) == set(modules()) and len(graph) > 50
    # a module-level import, a function-level import, and a lazily exported package name
    assert "loopnet.model.scales" in graph["loopnet.model.config"]
    assert "loopnet.data.parquet" in graph["loopnet.data.sources"]  # inside a function
    assert "loopnet.training.module" in graph["loopnet.study.update_groups"]
    assert "loopnet.model.config" in graph["loopnet.study.update_groups"]  # `from loopnet.model import LoopConfig`


def test_no_import_circles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles in loopnet (every import counts, lazy ones too):\n" + "\n".join(
        f"  {describe(c, graph)}   (component: {', '.join(c)})" for c in found
    )


def test_a_new_circle_is_caught(tmp_path):
    """The check itself: a two-module package whose circle closes through a lazy, relative import."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub.b import g\n\ndef f():\n    return g()\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from ..a import f\n    return f\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    assert describe(["pkg.a", "pkg.sub.b"], graph) == "pkg.a -> pkg.sub.b -> pkg.a"


def outside_imports(root: Path = ROOT, package: str = PACKAGE, outside: str = "experiments") -> list[str]:
    """`file:line` of every import of `outside` (absolute, wherever it stands) in `package`'s modules."""
    found = []
    for name, path in modules(root, package).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(n == outside or n.startswith(outside + ".") for n in names):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_package_never_imports_experiments():
    """experiments/ (the studies' readers) builds on loopnet one way: the installed package runs without it."""
    assert (ROOT / "experiments" / "__init__.py").is_file()
    found = outside_imports()
    assert not found, "loopnet imports experiments/ (the dependency runs one way, experiments -> loopnet):\n  " + (
        "\n  ".join(found)
    )


def test_experiments_have_no_import_circles():
    graph = import_graph(ROOT, "experiments")
    assert "experiments.sources" in graph["experiments.rival.readings"] & graph["experiments.map.readings"]
    assert not cycles(graph), [describe(c, graph) for c in cycles(graph)]


def test_an_import_of_experiments_is_caught(tmp_path):
    """The check itself: a module-level and a lazy import of experiments are both found; a relative one is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import experiments.map\n")
    (pkg / "b.py").write_text("def f():\n    from experiments.rival import readings\n    return readings\n")
    (pkg / "c.py").write_text("from . import a\nimport experimental\n")
    assert outside_imports(tmp_path, "pkg") == ["pkg/a.py:1", "pkg/b.py:2"]
