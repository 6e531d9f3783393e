"""`make mutants` (scripts/mutants.py): every group's function patterns name functions that exist in its module
(a renamed function would otherwise drop out of mutation testing unnoticed), and its tests exist."""

import ast
import fnmatch
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
mutants = importlib.util.module_from_spec(spec)
sys.modules["mutants"] = mutants  # dataclasses look their module up there
spec.loader.exec_module(mutants)


def mutmut_names(module: Path) -> set[str]:
    """mutmut's names of the functions it mutates: `x_<function>` at module level, `xǁ<Class>ǁ<method>`."""
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"xǁ{node.name}ǁ{f.name}" for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return names


@pytest.mark.parametrize("name", list(mutants.GROUPS))
def test_each_group_names_functions_and_tests_that_exist(name):
    group = mutants.GROUPS[name]
    functions = mutmut_names(ROOT / group.module)
    for pattern in group.functions:
        assert fnmatch.filter(functions, pattern), f"{name}: {pattern} matches no function of {group.module}"
    for test in group.tests:
        path, _, function = test.partition("::")
        assert (ROOT / path).is_file(), f"{name}: no {path}"
        assert not function or f"def {function}(" in (ROOT / path).read_text(), f"{name}: no {test}"
    dotted = group.module.removesuffix(".py").replace("/", ".")
    assert all(p.startswith(dotted + ".") and p.endswith("__mutmut_*") for p in group.patterns())
