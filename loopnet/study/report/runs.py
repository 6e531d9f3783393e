"""The runs of a sweep as the report reads them: each cell's summary.json, grid values, method, R and
seed, its TensorBoard curves, and the sweep's unigram plateau. Reads only what the runs left on
disk, never a model or checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loopnet.diagnostics import SUMMARY_NAME
from loopnet.diagnostics.tags import sublayer_tag, visit_tag
from loopnet.model import SUBLAYERS, Visit

from ..measures import LR_KEY, end_loss, escape_step, method_label
from ..sweep import FINAL_STATUSES, MANIFEST, cell_summary

FIRST_FFN_GRAD = sublayer_tag("grad_norm", Visit(1, 1, "ffn").physical)  # the FLT paper's first-FFN gradient


@dataclass
class Run:
    """One cell as the report sees it: its grid values and what its summary says."""

    id: str
    params: dict[str, Any]
    summary: dict | None
    method: str = "?"
    scheme: str = "?"
    p: float | None = None
    rounds: int | None = None
    seed: Any = None
    lr: float | None = None
    family: str = "?"  # the method without the learning rate: one curve of the stability map
    escaped: bool | None = None
    plateau: float | None = None
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.summary["status"] if self.summary else "not run"

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def value(self, key: str) -> Any:
        return self.summary.get(key) if self.summary else None

    @property
    def kappa(self) -> float | None:
        kappa = self.value("kappa") or {}
        return kappa.get("model")

    @property
    def escape_step(self) -> int | None:
        """`measures.escape_step` of the run's validation losses (its summary's `val_history`); None
        when the run did not escape."""
        if not self.escaped or self.plateau is None:
            return None
        return escape_step(self.value("val_history") or [], self.plateau)

    @property
    def end_loss(self) -> float | None:
        return end_loss(self.summary)


# ---------------------------------------------------------------------------------------- reading
def load_runs(sweep_dir: Path) -> tuple[list[Run], dict]:
    """Every cell of the sweep (from its manifest; without one, every sub-folder with a summary)."""
    manifest_path = sweep_dir / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    cells = manifest.get("cells") or [
        {"id": p.parent.name, "params": {}} for p in sorted(sweep_dir.glob(f"*/{SUMMARY_NAME}"))
    ]
    runs = []
    for cell in cells:
        runs.append(Run(cell["id"], dict(cell.get("params") or {}), cell_summary(sweep_dir / cell["id"])))
    default_config = next((r.summary["config"] for r in runs if r.summary and r.summary.get("config")), {})
    for run in runs:
        describe(run, sweep_dir, default_config)
    return runs, manifest


def describe(run: Run, sweep_dir: Path, default_config: dict) -> None:
    """Fill in the run's method label, R and seed (from its summary, else its grid values)."""
    config = dict(default_config)
    for key, value in run.params.items():
        if key.startswith("model.config."):
            config[key.removeprefix("model.config.")] = value
    if run.summary and run.summary.get("config"):
        config = run.summary["config"]
    run.scheme = config.get("residual", "?")
    run.p = config.get("p")
    run.rounds = config.get("n_rounds")
    run.method = method_label(config, run.params)
    run.family = method_label(config, {k: v for k, v in run.params.items() if k != LR_KEY})
    run.lr = run.params.get(LR_KEY)
    if run.lr is None:  # not a grid key: the rate the fit used
        run.lr = ((run.value("hparams") or {}).get("optim") or {}).get("lr")
    run.seed = run.params.get("seed_everything")
    if run.seed is None:  # not a grid key: the seed the fit resolved (its config.yaml)
        try:
            run.seed = yaml.safe_load((sweep_dir / run.id / "config.yaml").read_text()).get("seed_everything")
        except (FileNotFoundError, AttributeError, yaml.YAMLError):
            pass


CURVES = ("train/loss", "val/loss", "grad/kappa_model", "update/output_change", FIRST_FFN_GRAD)


def final_state_tags(n_blocks: int, n_rounds: int) -> tuple[str, str]:
    """The state RMS at the end of the last round (the last visit's output; Pre-LN: the stream): logged as
    its deviation from 1 (`state_norm_dev`), by runs before that as `state_norm`."""
    last = Visit(n_rounds, n_blocks, SUBLAYERS[-1])
    return visit_tag("state_norm_dev", last), visit_tag("state_norm", last)


def final_state_curve(curves: dict, n_blocks: int, n_rounds: int) -> list[tuple[int, float]] | None:
    """The end-of-loop state RMS over the steps, from whichever of `final_state_tags` the run logged."""
    dev, old = final_state_tags(n_blocks, n_rounds)
    if dev in curves:
        return [(step, 1.0 + value) for step, value in curves[dev]]
    return curves.get(old)


def read_curves(run_dir: Path, tags=CURVES) -> dict[str, list[tuple[int, float]]]:
    """Scalar curves of a run from its TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not run_dir.is_dir():
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    available = set(acc.Tags().get("scalars", []))
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags if tag in available}


def sweep_plateau(runs: list[Run], sweep_dir: Path, cache_dir: Path) -> tuple[float, str]:
    """The unigram plateau of the sweep's validation loss (`loopnet.study.unigram.run_plateau`),
    from the first cell's resolved config; computed once and cached in `cache_dir`."""
    from ..unigram import run_plateau

    config = None
    for run in runs:
        path = sweep_dir / run.id / "config.yaml"
        if path.is_file():
            config = yaml.safe_load(path.read_text()) or {}
            break
    if config is None:
        raise ValueError("no cell has a config.yaml to read the data source from; pass --plateau VALUE")
    # What the plateau depends on: the data, and which tokens a run validates on.
    key = {
        "data": config.get("data"),
        "seq_len": config["model"]["config"]["seq_len"],
        "limit_val_batches": (config.get("trainer") or {}).get("limit_val_batches"),
    }
    cache = cache_dir / "plateau.json"
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["plateau"], cached["how"]
    value, how = run_plateau(config)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "plateau": value, "how": how}, indent=2) + "\n")
    return value, how
