"""Mutation testing over the code where a silent bug corrupts the science (`make mutants`, docs/testing.md).

mutmut changes the code one small bug at a time (an operator, a constant, a dropped argument) and runs, on
each mutant, the tests that reach the changed function; a mutant that no test fails *survived*. Each group
below names the functions it mutates and the quick tests that guard them, and runs in its own scratch copy
of the tree (MUTANTS_DIR/<group>): the checkout is never touched.

    python scripts/mutants.py                      every group, then the table of kill rates
    python scripts/mutants.py schedule probe       some groups
    python scripts/mutants.py --table              the table (and the survivors) of the last runs

Slow tests are left out (they run loopnet in subprocesses, where the mutant is not active), and so are the
`torch.compile` tests (dynamo does not trace through mutmut's trampolines).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Group:
    """One mutmut run: `functions` (mutmut's names: `x_<function>` at module level, `xǁ<Class>ǁ<method>`
    in a class; fnmatch patterns) in `module`, guarded by the quick tests `tests` (files, or file::test)."""

    module: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]
    deselect: str = ""  # a pytest -k expression: quick tests that reach the code but cost minutes per mutant

    def patterns(self) -> list[str]:
        dotted = self.module.removesuffix(".py").replace("/", ".")
        return [f"{dotted}.{function}__mutmut_*" for function in self.functions]


GROUPS = {
    # The residual schemes' α and β and the branch-scaling rules: the whole file.
    "scales": Group(
        "loopnet/model/scales.py",
        ("*",),
        (
            "tests/model/test_scales_direct.py",
            "tests/model/test_branch_scale.py",
            "tests/model/test_model.py",
            "tests/model/test_config.py",
        ),
    ),
    # The loop: blocks, scales, the wirings, rounds, the loss over the loss rounds (generation and
    # compilation are the inference and speed code, guarded by their own tests).
    "wirings": Group(
        "loopnet/model/transformer.py",
        (
            "x_lm_loss",
            "xǁLoopedTransformerǁ__init__",
            "xǁLoopedTransformerǁreset_parameters",
            "xǁLoopedTransformerǁprelude_blocks",
            "xǁLoopedTransformerǁcoda_blocks",
            "xǁLoopedTransformerǁ_head",
            "xǁLoopedTransformerǁ_block",
            "xǁLoopedTransformerǁembed",
            "xǁLoopedTransformerǁround",
            "xǁLoopedTransformerǁround_start",
            "xǁLoopedTransformerǁloss_round_indices",
            "xǁLoopedTransformerǁiter_rounds",
            "xǁLoopedTransformerǁhead",
            "xǁLoopedTransformerǁfinish",
            "xǁLoopedTransformerǁforward",
        ),
        (
            "tests/model/test_model.py",
            "tests/model/test_wirings.py",
            "tests/model/test_recipe_model.py",
            "tests/model/test_loop_arguments.py",
            "tests/diagnostics/test_visit_probe.py",
            "tests/model/test_cache.py::test_cached_logits_equal_the_full_forward_at_every_position",
            "tests/training/test_recipe_optim.py::test_the_model_adds_the_z_term_on_the_fused_and_the_plain_path",
        ),
        deselect="not static",
    ),  # the static cache (a compiled step's) is cache.py's, not the loop's
    # The per-visit probe: forward statistics, per-visit gradients, κ̂: the whole file.
    "probe": Group(
        "loopnet/diagnostics/visit_probe.py",
        ("*",),
        ("tests/diagnostics/test_visit_probe.py", "tests/diagnostics/test_visit_values.py"),
    ),
    # The callback's per-visit values (what it logs, not how it writes TensorBoard files).
    "callback": Group(
        "loopnet/diagnostics/callback.py",
        (
            "x_physical_sublayers",
            "x_step_draw",
            "x_total_norm",
            "x_global_norm",
            "xǁVisitDiagnosticsǁ_reset",
            "xǁVisitDiagnosticsǁon_train_batch_start",
            "xǁVisitDiagnosticsǁon_before_optimizer_step",
            "xǁVisitDiagnosticsǁon_train_batch_end",
        ),
        (
            "tests/diagnostics/test_visit_values.py",
            "tests/diagnostics/test_callback_steps.py",
            "tests/diagnostics/test_update_size.py",
            "tests/diagnostics/test_recipe_instruments.py",
        ),
    ),
    # The held-out split and the training stream's resume state.
    "data": Group(
        "loopnet/data/datamodule.py",
        (
            "xǁTokenStreamDataModuleǁn_held_out",
            "xǁTokenStreamDataModuleǁtrain_stream",
            "xǁTokenStreamDataModuleǁval_windows",
            "xǁTokenStreamDataModuleǁ_held_out_windows",
            "xǁTokenStreamDataModuleǁtrain_dataloader",
        ),
        (
            "tests/data/test_held_out.py",
            "tests/data/test_datamodule.py",
            "tests/data/test_valcache.py",
            "tests/data/test_compact_vocab.py",
        ),
    ),
    "stream": Group(
        "loopnet/data/stream.py",
        (
            "x_val_windows",
            "x_pack_windows",
            "xǁTrainStreamǁslot_texts",
            "xǁTrainStreamǁdocuments",
            "xǁResumableLoaderǁ*",
        ),
        (
            "tests/data/test_held_out.py",
            "tests/data/test_stream_state.py",
            "tests/data/test_datamodule.py",
            "tests/data/test_stream.py",
            "tests/data/test_packing.py",
            "tests/data/test_compact_vocab.py",
        ),
        deselect="not test_exact_resume_across_epochs",
    ),  # its loader workers: ~40 s a mutant
    # The learning-rate schedule and the optimiser's parameter groups.
    "schedule": Group(
        "loopnet/training/module.py",
        ("xǁLoopedLMǁconfigure_optimizers", "xǁLoopedLMǁ_param_groups"),
        ("tests/training/test_lr_schedule.py", "tests/training/test_optim.py", "tests/training/test_recipe_optim.py"),
    ),
    # The extrapolation and fixed-point profile: the round map, σ_max by power iteration, the per-round
    # quantities and their meter (the report's table is presentation).
    "fixed_point": Group(
        "loopnet/diagnostics/fixed_point.py",
        ("x_round_map", "x_round_jacobian_norm", "x_round_profile", "x_jacobian_profile", "xǁRoundProfileMeterǁ*"),
        (
            "tests/diagnostics/test_fixed_point.py",
            "tests/diagnostics/test_depth_sync.py",
            "tests/training/test_frontier.py",
        ),
    ),
    # The adaptive-exit criteria and the teacher-forced exit.
    "exit": Group(
        "loopnet/model/exit.py",
        ("xǁExitCriterionǁ*", "x_exit_logits"),
        ("tests/model/test_cache_exit.py", "tests/training/test_frontier.py", "tests/eval/test_exit.py"),
    ),
    # Checkpoint loading, checks and the run folders' versions: the whole file.
    "checkpoints": Group("loopnet/checkpoints.py", ("*",), ("tests/reliability/test_checkpoint_files.py",)),
}


def setup_cfg(group: Group) -> str:
    lines = [
        "[mutmut]",
        "source_paths = loopnet",
        "only_mutate =",
        f"    {group.module}",
        "pytest_add_cli_args_test_selection =",
    ] + [f"    {t}" for t in group.tests]
    k = "not compile" + (f" and {group.deselect}" if group.deselect else "")
    lines += [
        "pytest_add_cli_args =",
        "    -m",
        "    not slow",
        "    -k",
        f"    {k}",
        "    -p",
        "    no:cacheprovider",
        "process_isolation = forkserver",
    ]
    return "\n".join(lines) + "\n"


def copy_tree(dest: Path) -> None:
    """The checkout's files as git sees them (tracked and untracked, not ignored: not the venv)."""
    shutil.rmtree(dest, ignore_errors=True)
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in files:
        src = ROOT / name
        if name and src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run(name: str, group: Group, base: Path, jobs: int) -> int:
    work = base / name
    copy_tree(work)
    (work / "setup.cfg").write_text(setup_cfg(group))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    with open(work / "mutmut-run.log", "w") as log:
        status = subprocess.call(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *group.patterns()],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    results = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, env=env, capture_output=True, text=True
    ).stdout
    (work / "results.txt").write_text(results)
    if status:
        print(f"{name}: mutmut exited with {status}; see {work / 'mutmut-run.log'}", file=sys.stderr)
    return status


def results(base: Path, name: str) -> dict[str, str] | None:
    path = base / name / "results.txt"
    if not path.exists():
        return None
    out = {}
    for line in path.read_text().splitlines():
        mutant, sep, status = line.strip().rpartition(": ")
        if sep and any(fnmatch.fnmatch(mutant, pattern) for pattern in GROUPS[name].patterns()):
            out[mutant] = status  # `mutmut results` lists every mutant of the file: the group's only
    return out


def table(base: Path, names: list[str]) -> None:
    print(f"{'group':<12} {'module':<34} {'mutants':>7} {'killed':>7} {'survived':>8} {'no tests':>8} {'rate':>6}")
    runs = {name: results(base, name) for name in names}  # each results.txt read once
    for name, res in runs.items():
        if res is None:
            print(f"{name:<12} not run")
            continue
        counts = Counter(res.values())
        killed = counts["killed"] + counts["timeout"]
        rate = 100 * killed / len(res) if res else float("nan")
        print(
            f"{name:<12} {GROUPS[name].module:<34} {len(res):>7} {killed:>7} {counts['survived']:>8} "
            f"{counts['no tests']:>8} {rate:>5.1f}%"
        )
    for name, res in runs.items():
        left = sorted(m for m, s in (res or {}).items() if s not in ("killed", "timeout"))
        if left:
            print(f"\n{name}: {len(left)} not killed (cd {base / name} && {sys.executable} -m mutmut show NAME)")
            for m in left:
                print(f"  {m}: {res[m]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", help=f"groups to run, of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("MUTANTS_DIR", "/tmp/loopnet-mutants")))
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTANT_JOBS", "2")))
    parser.add_argument("--table", action="store_true", help="print the last runs' table only")
    args = parser.parse_args()
    names = args.groups or list(GROUPS)
    unknown = [name for name in names if name not in GROUPS]
    if unknown:
        parser.error(f"no group {', '.join(unknown)}; the groups: {', '.join(GROUPS)}")
    failed = 0
    if not args.table:
        for name in names:
            failed |= bool(run(name, GROUPS[name], args.dir, args.jobs))
    table(args.dir, names)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
