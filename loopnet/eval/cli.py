"""`loopnet eval`: run lm-evaluation-harness tasks on a checkpoint at several round counts R'.

    loopnet eval --ckpt_path runs/.../last.ckpt --tasks deeploop --rounds 1,3,6
    python -m loopnet.eval --ckpt_path X --tasks my_task --include_path tasks/ --limit 100

One harness run per R' on the same loaded weights; the table task × R' (acc and acc_norm, ± stderr)
is written beside the checkpoint as ``eval_<ckpt-stem>.json`` and ``.md`` (or under --output_dir),
under a new name (``-2``, ``-3``, ...) if those files already exist.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loopnet.env import one_line_errors
from loopnet.eval.tasks import PRESETS, TaskSetupError, check_datasets, expand_tasks, make_task_manager


def parse_rounds(text: str) -> list[int]:
    """ "1,3,6" -> [1, 3, 6] (order kept, duplicates dropped); each R' must be >= 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rounds takes comma-separated integers like 1,3,6, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--rounds must list round counts >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def parse_limit(text: str) -> int | float:
    """As in the harness: a count of examples per task, or a fraction of each task if < 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit takes a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--limit must be > 0, got {text!r}")
    return int(value) if value >= 1 and value.is_integer() else value


def build_parser() -> argparse.ArgumentParser:
    presets = "; ".join(f"{k} = {','.join(v)}" for k, v in PRESETS.items())
    parser = argparse.ArgumentParser(
        prog="loopnet eval",
        allow_abbrev=False,
        description="Evaluate a loopnet checkpoint with lm-evaluation-harness at one or more round counts R'.",
    )
    parser.add_argument(
        "--ckpt_path",
        required=True,
        help="LoopedLM checkpoint (.ckpt) to evaluate, or a model "
        "folder of `loopnet import` / `loopnet retrofit` (its own tokenizer.json, when present)",
    )
    parser.add_argument(
        "--tasks",
        required=True,
        help=f"comma-separated lm-eval task, group or tag names, or presets ({presets})",
    )
    parser.add_argument(
        "--rounds", type=parse_rounds, default=None, help="comma-separated round counts R' (default: the training R)"
    )
    parser.add_argument("--batch_size", type=int, default=16, help="sequences per forward pass (default 16)")
    parser.add_argument(
        "--limit", type=parse_limit, default=None, help="examples per task (or a fraction < 1); for quick checks only"
    )
    parser.add_argument(
        "--num_fewshot", type=int, default=None, help="few-shot examples (default: the task's, 0 for the preset)"
    )
    parser.add_argument(
        "--include_path",
        action="append",
        default=None,
        metavar="DIR",
        help="folder of extra task YAMLs, e.g. tasks on local JSON lines (repeatable)",
    )
    parser.add_argument(
        "--output_dir", default=None, help="where to write the results (default: beside the checkpoint)"
    )
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    parser.add_argument(
        "--exit",
        default="none",
        choices=("none", "kl", "latent", "entropy", "argmax", "gate"),
        help="adaptive exit per token (each R' is then the most rounds a token runs); default none",
    )
    parser.add_argument(
        "--exit_threshold",
        type=float,
        default=None,
        help="the exit criterion's threshold (default: its own, e.g. kl 1e-3, gate 0.5)",
    )
    return parser


def run_eval(
    ckpt_path: str | Path,
    tasks: str | list[str],
    rounds: list[int] | None = None,
    batch_size: int = 16,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    include_path: list[str] | None = None,
    output_dir: str | Path | None = None,
    device: str = "cpu",
    exit: str = "none",
    exit_threshold: float | None = None,
) -> dict[str, Any]:
    """Run the harness for each R', write the JSON and markdown table, return the report.

    The report holds the table ``{task: {metric: {R': {"value", "stderr"}}}}``, the harness's raw
    per-task results for each R', the mean rounds per token of each task ``{R': {task: mean}}`` (R'
    itself without an exit criterion), and under "files" the two paths written.
    """
    ckpt = Path(ckpt_path).expanduser()
    if not ckpt.exists():  # before importing the harness, which takes seconds
        raise FileNotFoundError(
            f"checkpoint not found: {ckpt}; fix: give the .ckpt file with --ckpt_path "
            f"(e.g. runs/<run>/version_N/checkpoints/last.ckpt)"
        )
    from loopnet.checkpoints import check_checkpoint_file

    imported = ckpt.is_dir() and (ckpt / "config.json").is_file()  # a folder of `loopnet import` or `retrofit`
    if not imported:
        check_checkpoint_file(str(ckpt))  # a folder or an empty file: what to pass instead
    from loopnet.model.exit import check_exit

    check_exit(exit, exit_threshold, where="--exit/--exit_threshold:")
    if batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {batch_size}")
    names = expand_tasks(tasks)
    from loopnet.checkpoints import load_checkpoint_meta, model_weights
    from loopnet.files import check_writable

    # Readable, plain data (no pickled code), loopnet's, GPT-2 ids: one line, not a traceback, and before
    # the harness's task set-up; the tensors stay on disk until the model is built.
    tokenizer = None
    if imported:  # its own weights and, when it has one, its own tokenizer
        from loopnet.formats.folder import read_folder
        from loopnet.formats.tokenizer import HFTokenizer

        loop_config, weights, _ = read_folder(ckpt)
        config = asdict(loop_config)
        tokenizer = HFTokenizer(ckpt) if (ckpt / "tokenizer.json").is_file() else None
    else:
        config, weights = model_weights(load_checkpoint_meta(str(ckpt)), ckpt)
    folder = Path(output_dir).expanduser() if output_dir is not None else (ckpt if imported else ckpt.parent)
    check_writable(str(folder), "--output_dir")  # before the evaluation, not after it
    try:
        import lm_eval
        import torch
    except ImportError as err:
        raise ImportError(
            f"loopnet eval needs lm-evaluation-harness ({err}); install it with: pip install lm-eval"
        ) from None
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device} requested but CUDA is not available; use --device cpu")

    from loopnet.checkpoints import build_network
    from loopnet.eval.adapter import LoopnetLM

    manager = make_task_manager(names, include_path)
    check_datasets(manager, names)
    model = build_network(config, weights, device)
    train_rounds = model.config.n_rounds
    rounds = rounds or [train_rounds]

    outputs: dict[int, dict[str, Any]] = {}
    mean_rounds: dict[str, dict[str, float]] = {}
    for r in rounds:
        print(f"loopnet eval: R'={r} on {', '.join(names)}", file=sys.stderr)
        lm = LoopnetLM(
            ckpt_path=str(ckpt),
            model=model,
            rounds=r,
            batch_size=batch_size,
            device=device,
            exit=exit,
            exit_threshold=exit_threshold,
            tokenizer=tokenizer,
        )
        outputs[r] = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            device=device,
            log_samples=False,
        )
        mean_rounds[str(r)] = lm.mean_rounds_by_task()

    from loopnet.eval.results import build_table, write_report

    report: dict[str, Any] = {
        "checkpoint": str(ckpt.resolve()),
        "train_rounds": train_rounds,
        "rounds": list(rounds),
        "tasks": names,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "lm_eval_version": lm_eval.__version__,
        "model_config": asdict(model.config),
        "exit": exit,
        "exit_threshold": exit_threshold,
        "mean_rounds": mean_rounds,
        "table": build_table(outputs),
        "harness": {
            str(r): {k: out.get(k) for k in ("results", "groups", "n-samples", "versions")}
            for r, out in outputs.items()
        },
    }
    json_path, md_path = write_report(report, folder, f"eval_{ckpt.stem}")
    report["files"] = {"json": str(json_path), "markdown": str(md_path)}
    return report


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``loopnet eval`` / ``python -m loopnet.eval``; errors exit with status 2."""
    from loopnet.training.trust import take_flag

    # --trust_config: task folders whose YAML names Python functions (loopnet.eval.tasks.refuse_task_code)
    args = build_parser().parse_args(take_flag(sys.argv[1:] if argv is None else list(argv)))
    with one_line_errors("loopnet eval", (TaskSetupError, ValueError, FileNotFoundError, ImportError), debug=True):
        report = run_eval(
            ckpt_path=args.ckpt_path,
            tasks=args.tasks,
            rounds=args.rounds,
            batch_size=args.batch_size,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            include_path=args.include_path,
            output_dir=args.output_dir,
            device=args.device,
            exit=args.exit,
            exit_threshold=args.exit_threshold,
        )
    print(Path(report["files"]["markdown"]).read_text(encoding="utf-8"))
    print(f"loopnet eval: wrote {report['files']['json']} and {report['files']['markdown']}", file=sys.stderr)
