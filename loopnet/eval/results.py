"""The results table (task × R') built from the harness's output, and its JSON / markdown files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PRIMARY_METRICS = ("acc", "acc_norm")


def _number(value: Any) -> float | None:
    """Harness values are floats, or "N/A" where a stderr could not be computed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def metrics_of(task_results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """{metric: {"value", "stderr"}} from one task's entry of ``results["results"]``.

    Keys there read "acc,none" / "acc_stderr,none" (metric, filter). acc and acc_norm are kept
    when the task has them; otherwise every metric it reports (e.g. perplexities).
    """
    found: dict[str, dict[str, float | None]] = {}
    for key, value in task_results.items():
        metric, comma, filter_name = key.partition(",")
        if not comma or metric.endswith("_stderr") or _number(value) is None:
            continue
        stderr = task_results.get(f"{metric}_stderr,{filter_name}")
        found.setdefault(metric, {"value": _number(value), "stderr": _number(stderr)})
    primary = {m: found[m] for m in PRIMARY_METRICS if m in found}
    return primary or found


def build_table(results_by_rounds: dict[int, dict[str, Any]]) -> dict[str, dict[str, dict[str, dict]]]:
    """{task: {metric: {R': {"value", "stderr"}}}} from {R': simple_evaluate(...) output}."""
    table: dict[str, dict[str, dict[str, dict]]] = {}
    for rounds, output in results_by_rounds.items():
        for task, task_results in output["results"].items():
            for metric, cell in metrics_of(task_results).items():
                table.setdefault(task, {}).setdefault(metric, {})[str(rounds)] = cell
    return table


def _cell(cell: dict | None) -> str:
    if not cell or cell["value"] is None:
        return "–"
    text = f"{cell['value']:.4f}"
    return text + (f" ± {cell['stderr']:.4f}" if cell.get("stderr") is not None else "")


def to_markdown(report: dict[str, Any]) -> str:
    """A markdown page: what was evaluated, then one row per (task, metric), one column per R'."""
    rounds, train = report["rounds"], report["train_rounds"]
    heads = [f"R'={r}" + (" (train)" if r == train else "") for r in rounds]
    lines = [
        f"# Downstream evaluation of `{report['checkpoint']}`",
        "",
        f"lm-evaluation-harness {report['lm_eval_version']}; trained with R={train}; "
        f"few-shot: {report['num_fewshot'] if report['num_fewshot'] is not None else 'task default'}; "
        f"limit: {report['limit'] if report['limit'] is not None else 'none'}; "
        f"exit: {report.get('exit', 'none')}"
        + (f" (threshold {report['exit_threshold']})" if report.get("exit_threshold") is not None else "")
        + ".",
        "",
        "| task | metric | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(rounds),
    ]
    table = report["table"]
    for task, metrics in table.items():
        for metric, cells in metrics.items():
            lines.append(f"| {task} | {metric} | " + " | ".join(_cell(cells.get(str(r))) for r in rounds) + " |")
    rounds_used = report.get("mean_rounds") or {}
    for task in sorted({t for cells in rounds_used.values() for t in cells}):
        cells = [rounds_used.get(str(r), {}).get(task) for r in rounds]
        lines.append(
            f"| {task} | mean rounds per token | " + " | ".join("–" if c is None else f"{c:.3f}" for c in cells) + " |"
        )
    with_acc = [m["acc"] for m in table.values() if "acc" in m]
    if len(with_acc) > 1:  # DeepLoop's summary number: mean acc over the tasks
        means = []
        for r in rounds:
            vals = [c[str(r)]["value"] for c in with_acc if c.get(str(r), {}).get("value") is not None]
            means.append(f"{sum(vals) / len(vals):.4f}" if len(vals) == len(with_acc) else "–")
        lines.append(f"| **mean ({len(with_acc)} tasks)** | acc | " + " | ".join(means) + " |")
    return "\n".join(lines) + "\n"


def free_stem(folder: Path, stem: str, suffixes=(".json", ".md")) -> str:
    """`stem`, or `stem-2`, `stem-3`, ... : the first name under which no results file exists yet,
    so an earlier evaluation is never overwritten."""
    candidate, n = stem, 1
    while any((folder / f"{candidate}{s}").exists() for s in suffixes):
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def write_report(report: dict[str, Any], folder: Path, stem: str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` (renamed to a free stem if taken); return both paths.

    The files are created exclusively ("x" mode), so a file that appeared meanwhile is not replaced.
    """
    folder.mkdir(parents=True, exist_ok=True)
    stem = free_stem(folder, stem)
    json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
    with open(json_path, "x", encoding="utf-8") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    with open(md_path, "x", encoding="utf-8") as f:
        f.write(to_markdown(report))
    return json_path, md_path
