"""The report and probe code stay easy to change: the probe draws through the shared
plotting helper (not the report's private functions), the map's report is its own module, and the
`loopnet` entry point and the Trainer CLI do not import each other."""

import ast
from pathlib import Path

import loopnet

PKG = Path(loopnet.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative ones resolved against its package)."""
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}
    return names


def test_commands_and_the_trainer_cli_do_not_import_each_other():
    assert "loopnet.training.cli" in imported_modules(PKG / "commands.py")  # the entry point dispatches to it
    assert not any(m.startswith("loopnet.commands") for m in imported_modules(PKG / "training" / "cli.py"))


def test_probe_uses_the_shared_plotting_helper_not_the_reports_privates():
    probe = imported_modules(PKG / "study" / "probe.py")
    assert "loopnet.study.plotting.pyplot" in probe and "loopnet.study.plotting.save" in probe
    assert not any(m.startswith("loopnet.study.report") for m in probe)


def test_the_report_is_a_package_with_one_module_per_part():
    report = PKG / "study" / "report"
    assert {"runs.py", "tables.py", "depth.py", "curves.py", "exponent.py", "map.py", "build.py"} <= {
        p.name for p in report.glob("*.py")
    }
    assert not (PKG / "study" / "report.py").exists()
    # a module a reader takes in at once (lines as the formatter, ruff format, writes them)
    assert max(len(p.read_text().splitlines()) for p in report.glob("*.py")) < 500
