"""The GPU check's steps, run by scripts/gpu_check.sh (docs/gpu-check.md): each a real `loopnet fit` (or a
short script) in its own process, within its own time limit, one table written row by row (a check stopped
part-way leaves the rows so far), exit status 1 when a check failed. `--cpu-dry-run` runs the same steps at toy
size on this machine's CPU (2 gloo processes stand in for 2 GPUs; FSDP through the test suite's CPU subclass of
Lightning's strategy), to check the script's logic.

    python scripts/gpu_check.py [--cpu-dry-run] [--out DIR] [--only STEP ...] [--budget S]

The time limits come from one budget, the whole check's (gpu_check.sh's install and preflight included): they
add up to it by construction (`limits`).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One budget: one call of the device tool, under its 10-minute cap. gpu_check.sh spends SETUP_S (the carried wheels'
# install, then the preflight: versions and requirements, loopnet's imports) and gives the rest to this script,
# under `timeout -k KILL_GRACE_S`; of that, REPORT_S is kept for reading the runs' events and the table, and the
# steps share what is left in proportion to SHARES (their order is the order they run in: MFU first). The shares are
# the times measured on one H200 (docs/gpu-check.md) with about 20% to spare; DDP's (unmeasured) is a first estimate.
BUDGET_S = 590
DRY_BUDGET_S = 1800  # --cpu-dry-run: toy sizes, but a 2-core CPU
SETUP_S = {"install": 20, "preflight": 40}
KILL_GRACE_S = 5
REPORT_S = 15
SHARES = {"mfu": 101, "custom_loss": 18, "parity": 104, "resume": 119, "fsdp": 69, "parquet": 64, "ddp": 35}


def limits(budget: float = BUDGET_S) -> dict[str, int]:
    """Each step's time limit in s, and gpu_check.sh's: `setup_install`, `setup_preflight` and `steps` (this
    script's own limit). The steps' limits add up to at most `steps` - REPORT_S, and `steps` + the setup + the
    kill grace to `budget`."""
    steps = int(budget) - sum(SETUP_S.values()) - KILL_GRACE_S
    room = steps - REPORT_S
    if room < len(SHARES):
        raise ValueError(f"--budget {budget}: too small for the setup ({sum(SETUP_S.values())} s) and the steps")
    total = sum(SHARES.values())
    out = {name: room * share // total for name, share in SHARES.items()}
    return out | {f"setup_{k}": v for k, v in SETUP_S.items()} | {"steps": steps}


@dataclass
class Check:
    name: str
    status: str  # "ok", "FAIL", "skipped"
    figure: str
    limit: str
    seconds: float


class Runner:
    def __init__(self, out: Path, dry: bool, budget: float):
        self.out, self.dry = out, dry
        self.runs = out / "runs"
        self.checks: list[Check] = []
        self.limits = limits(budget)
        self.end = time.monotonic() + self.limits["steps"] - REPORT_S  # no subprocess runs past it
        self.step, self.step_end = "", self.end
        self.timed_out = False  # a subprocess of the step under way reached the step's limit
        self.gpus = 0 if dry else _gpu_count()
        size = (
            [
                "--model.config.d_model",
                "32",
                "--model.config.n_heads",
                "2",
                "--model.config.seq_len",
                "32",
                "--model.config.n_rounds",
                "2",
                "--data.batch_size",
                "4",
                "--trainer.accelerator",
                "cpu",
                "--data.vocab",
                "compact",
                "--model.config.vocab_size",
                "19136",
            ]
            if dry
            else ["--data.batch_size", "8"]
        )  # GPU: configs/base.yaml's GPT-2-small width, d = 768, T = 1024
        self.base = [
            "--config",
            str(ROOT / "configs/deeploop_r6.yaml"),
            "--data.source",
            "shakespeare",
            "--data.path",
            "null",
            "--data.revision",
            "null",
            "--data.name",
            "null",
            "--data.val_fraction",
            "null",
            "--data.val_max_tokens",
            "null",
            "--data.num_workers",
            "0",
            "--model.optim.warmup_steps",
            "10",
            "--model.optim.decay_steps",
            "50",
            "--trainer.log_every_n_steps",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.val_check_interval",
            "10",
            "--trainer.devices",
            "1",
            *size,
        ]

    # ------------------------------------------------------------------------------------------ running
    def begin(self, step: str) -> None:
        """The step `step` starts: its subprocesses share its time limit (and none runs past the budget's end)."""
        self.step = step
        self.step_end = min(time.monotonic() + self.limits.get(step, 0), self.end)
        self.timed_out = False

    def _timeout(self) -> float:
        return self.step_end - time.monotonic()

    def _run(self, cmd: list[str], **kwargs) -> tuple[int, str]:
        """`cmd` within the step's time left: (exit status, its output when captured); 124 when out of time.
        In a process group of its own, killed whole (a fit's DDP ranks too) at the limit or a stop."""
        left = self._timeout()
        if left <= 1:
            self.timed_out = True
            return 124, "no time left in the step's limit"
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=left)
        except BaseException as exc:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            self.timed_out = True
            return 124, f"timed out after {left:.0f} s (the step's limit)"
        return proc.returncode, (out or "") + (err or "")

    def fit(self, name: str, *args: str, resume: bool = False) -> tuple[int, float, Path]:
        """`loopnet fit` with the check's base settings and `args`, its run folder runs/<name>/version_0."""
        save = self.runs / name
        cmd = [
            sys.executable,
            "-m",
            "loopnet.training.cli",
            "fit",
            *self.base,
            *args,
            "--trainer.logger.init_args.save_dir",
            str(save),
            "--trainer.logger.init_args.name",
            "",
            "--trainer.logger.init_args.version",
            "0",
        ]
        if resume:
            cmd += ["--ckpt_path", "last"]
        start = time.perf_counter()
        with open(self.out / f"{name}.log", "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            rc, text = self._run(cmd, stdout=log, stderr=subprocess.STDOUT)
            log.write(text)
        return rc, time.perf_counter() - start, save / "version_0"

    def python(self, name: str, code: str) -> tuple[int, str, float]:
        start = time.perf_counter()
        rc, text = self._run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        (self.out / f"{name}.log").write_text(text)
        return rc, text, time.perf_counter() - start

    # ------------------------------------------------------------------------------------------ the table
    def header(self) -> None:
        where = "CPU dry run (toy size)" if self.dry else f"{self.gpus} GPU(s): {_gpu_name()}"
        rows = [f"GPU check on {where}", "", "| check | result | measured | limit | s |", "|---|---|---|---|---|"]
        (self.out / "table.md").write_text("\n".join(rows) + "\n")

    def add(self, name: str, ok: bool | None, figure: str, limit: str, seconds: float) -> None:
        """A row of the table, appended to table.md at once (flushed to disk)."""
        status = "skipped" if ok is None else ("ok" if ok else "FAIL")
        if self.timed_out:
            status, figure = "FAIL", f"time limit ({self.limits.get(self.step, 0)} s) reached; {figure}"
        check = Check(name, status, figure, limit, seconds)
        self.checks.append(check)
        with open(self.out / "table.md", "a") as table:
            cells = (c.replace("|", "\\|") for c in (check.name, check.status, check.figure, check.limit))
            table.write("| " + " | ".join(cells) + f" | {check.seconds:.0f} |\n")
            table.flush()
            os.fsync(table.fileno())
        print(f"gpu_check: {name}: {status} ({figure}; {limit}) in {seconds:.0f} s", flush=True)

    def note(self, line: str) -> None:
        with open(self.out / "table.md", "a") as table:
            table.write(f"\n{line}\n")

    # ------------------------------------------------------------------------------------------ checks
    def parity(self) -> None:
        """bf16-mixed vs fp32 (`32-true`: the fp32 training head, `LinearCrossEntropy`), same seed and data."""
        runs = {
            p: self.fit(f"parity_{p}", "--trainer.precision", p, "--trainer.max_steps", "50")
            for p in ("bf16-mixed", "32-true")
        }
        seconds = sum(s for _, s, _ in runs.values())
        losses = {p: scalars(folder).get("train/loss", {}) for p, (_, _, folder) in runs.items()}
        a, b = losses["bf16-mixed"], losses["32-true"]
        steps = sorted(a.keys() & b.keys())
        if any(rc for rc, _, _ in runs.values()) or len(steps) < 50:
            return self.add(
                "bf16 vs fp32 loss, 50 steps",
                False,
                f"exit {[rc for rc, _, _ in runs.values()]}, {len(steps)} common steps",
                "both complete 50 steps",
                seconds,
            )
        diff = [abs(a[s] - b[s]) for s in steps]
        mean, last = sum(diff) / len(diff), sum(diff[-10:]) / 10
        self.add(
            "bf16 vs fp32 loss, 50 steps",
            mean <= 0.05 and last <= 0.1,
            f"mean |Δ| {mean:.4f}, last 10 {last:.4f} (fp32 {b[steps[-1]]:.3f} at step {steps[-1]})",
            "mean ≤ 0.05, last 10 ≤ 0.1 nat",
            seconds,
        )

    def custom_loss(self) -> None:
        """The fp32 training head's one-softmax loss against F.cross_entropy on the logits, on the device."""
        n, d, v = (256, 32, 512) if self.dry else (8192, 768, 50304)
        code = f"""
import torch, torch.nn.functional as F
from loopnet.model.kernels import LinearCrossEntropy
dev = "cpu" if {self.dry} else "cuda"
torch.manual_seed(0)
x = torch.randn({n}, {d}, device=dev, requires_grad=True)
w = (torch.randn({v}, {d}, device=dev) * 0.02).requires_grad_()
t = torch.randint(0, {v}, ({n},), device=dev); t[:7] = -1
loss, _ = LinearCrossEntropy.apply(x, w, t)
gx, gw = torch.autograd.grad(loss, (x, w))
ref = F.cross_entropy(x @ w.t(), t, ignore_index=-1)
rx, rw = torch.autograd.grad(ref, (x, w))
rel = lambda a, b: ((a - b).norm() / b.norm()).item()
print(json.dumps({{"loss": loss.item(), "reference": ref.item(), "errors": {{
    "loss": abs(loss.item() - ref.item()) / ref.item(), "grad x": rel(gx, rx), "grad W": rel(gw, rw)}}}}))
"""
        rc, text, seconds = self.python("custom_loss", "import json\n" + code)
        try:
            found = json.loads(text.strip().splitlines()[-1])
            errors = found["errors"]
            figure = f"loss {found['loss']:.6f} vs {found['reference']:.6f}; rel. errors " + ", ".join(
                f"{k} {v:.1e}" for k, v in errors.items()
            )
        except (ValueError, KeyError, IndexError):
            errors, figure = (
                {"failed": math.inf},
                f"exit {rc}: " + (text.strip().splitlines() or ["no output"])[-1][-150:],
            )
        self.add(
            "fp32 custom loss vs F.cross_entropy" + ("" if self.dry else f" (N {n}, V {v})"),
            rc == 0 and max(errors.values()) <= 1e-5,
            figure,
            "rel. errors ≤ 1e-5",
            seconds,
        )

    def ddp(self) -> None:
        n = 2 if self.dry else self.gpus
        if n < 2:
            return self.add("DDP", None, f"{self.gpus} GPU", "needs ≥ 2 GPUs", 0.0)
        rc, seconds, folder = self.fit(
            "ddp", "--trainer.strategy", "ddp", "--trainer.devices", str(n), "--trainer.max_steps", "20"
        )
        self.add(
            f"DDP, {n} {'CPU processes' if self.dry else 'GPUs'}",
            *self._completed(rc, folder, 20),
            "completes, finite loss",
            seconds,
        )

    def fsdp(self) -> None:
        """configs/fsdp.yaml on the GPUs present, then a resume from its sharded checkpoint (--ckpt_path last)."""
        n = 2 if self.dry else max(self.gpus, 1)
        args = ["--config", str(ROOT / "configs/fsdp.yaml"), "--trainer.devices", str(n), "--trainer.num_nodes", "1"]
        if (
            self.dry
        ):  # Lightning refuses FSDPStrategy itself on CPU: the test suite's subclass (tests/reliability/fsdp_cpu.py)
            args += [
                "--trainer.strategy.class_path",
                "tests.reliability.fsdp_cpu.CPUFSDPStrategy",
                "--trainer.precision",
                "32-true",
            ]
        rc, seconds, folder = self.fit("fsdp", *args, "--trainer.max_steps", "10")
        rc2, seconds2, _ = self.fit("fsdp", *args, "--trainer.max_steps", "20", resume=True)
        ok, figure = self._completed(rc or rc2, folder, 20)
        sharded = (folder / "checkpoints" / "last.ckpt" / "meta.pt").is_file()
        self.add(
            f"FSDP, {n} {'CPU processes' if self.dry else 'GPU(s)'}, resumed at step 10",
            ok and sharded,
            f"{figure}, sharded checkpoint {'yes' if sharded else 'no'}",
            "completes 20 steps",
            seconds + seconds2,
        )

    def parquet(self) -> None:
        """Time from `loopnet fit` start to the end of a 1-step fit on a generated OpenWebText-shaped parquet
        corpus (8 shards, a `text` column). The fuller bench is loopnet.bench's, where it exists."""
        corpus = self.out / "corpus"
        docs = 2000 if self.dry else 20000
        code = f"""
import random, pyarrow as pa, pyarrow.parquet as pq, pathlib
rng = random.Random(0)
words = ["the", "of", "loop", "model", "round", "block", "token", "stream", "paper", "data", "train", "shard"]
out = pathlib.Path({str(corpus)!r}); out.mkdir(parents=True, exist_ok=True)
for s in range(8):
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(200, 800))) for _ in range({docs} // 8)]
    pq.write_table(pa.table({{"text": texts}}), out / f"train-{{s:05d}}-of-00008.parquet")
print(sum(f.stat().st_size for f in out.glob("*.parquet")) / 1e6, "MB")
"""
        rc, text, gen_seconds = self.python("parquet_corpus", code)
        if rc:
            return self.add("parquet streaming: time to first step", False, "corpus not generated", "", gen_seconds)
        rc, seconds, folder = self.fit(
            "parquet",
            "--data.source",
            "files",
            "--data.path",
            str(corpus / "*.parquet"),
            "--data.val_fraction",
            "0.01",
            "--trainer.max_steps",
            "1",
            "--trainer.limit_val_batches",
            "0",
        )
        size = text.strip().splitlines()[-1]
        ok, figure = self._completed(rc, folder, 1)
        self.add(
            "parquet streaming: time to first step",
            ok and seconds <= 60,
            f"{seconds:.1f} s for a 1-step fit, start-up included ({size}, 8 shards); {figure}",
            "≤ 60 s",
            seconds,
        )

    def resume(self) -> None:
        """20 steps straight vs 10 steps then `--ckpt_path last` to 20: the per-step losses of steps 11-20."""
        rc, s1, straight = self.fit("resume_straight", "--trainer.max_steps", "20")
        rc2, s2, _ = self.fit("resume_split", "--trainer.max_steps", "10")
        rc3, s3, split = self.fit("resume_split", "--trainer.max_steps", "20", resume=True)
        a, b = (scalars(f).get("train/loss", {}) for f in (straight, split))
        steps = [s for s in sorted(a) if s >= 10 and s in b]
        seconds = s1 + s2 + s3
        if rc or rc2 or rc3 or len(steps) < 10:
            return self.add("resume", False, f"exit {rc}/{rc2}/{rc3}, {len(steps)} resumed steps", "", seconds)
        worst = max(abs(a[s] - b[s]) for s in steps)
        limit = 0.0 if self.dry else 0.02  # GPU kernels need not be bitwise deterministic
        self.add(
            "resume at step 10", worst <= limit, f"max |Δ loss| {worst:.2g} over steps 11-20", f"≤ {limit:g}", seconds
        )

    def mfu(self) -> None:
        """MFU at GPT-2-small width (d = 768, T = 1024) in bf16, compile off and on (TokenThroughput's)."""
        for compile_ in ("false", "true"):
            rc, seconds, folder = self.fit(
                f"mfu_compile_{compile_}",
                "--model.compile",
                compile_,
                "--trainer.max_steps",
                "60",
                "--trainer.limit_val_batches",
                "0",
                "--data.batch_size",
                "4" if self.dry else "16",
            )
            tags = scalars(folder)
            mfu = next((v for t, v in tags.items() if t.endswith("mfu")), {})
            tps = next((v for t, v in tags.items() if t.endswith("items_per_sec")), {})
            last = mfu[max(mfu)] if mfu else None
            ok, figure = self._completed(rc, folder, 60)
            figure = (
                (f"MFU {last:.1%}" if last is not None else "MFU n/a (no known peak)")
                + (f", {tps[max(tps)]:,.0f} tokens/s" if tps else "")
                + ("" if ok else f"; {figure}")
            )
            target = compile_ == "true" and not self.dry
            self.add(
                f"MFU, compile {compile_}",
                ok and (not target or (last or 0) >= 0.40),
                figure,
                "≥ 40% (compile on)" if target else "reported",
                seconds,
            )

    def _completed(self, rc: int, folder: Path, steps: int) -> tuple[bool, str]:
        try:
            summary = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            return False, f"exit {rc}, no summary.json"
        loss = summary.get("final_train_loss")
        ok = (
            rc == 0
            and summary.get("status") == "completed"
            and summary.get("global_step") == steps
            and loss is not None
            and math.isfinite(loss)
        )
        return ok, f"exit {rc}, {summary.get('status')} at step {summary.get('global_step')}, loss {loss}"


def scalars(version: Path) -> dict[str, dict[int, float]]:
    """Every scalar of a run folder's TensorBoard events: tag -> {step: value} (later files win: a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(f"{version}/events.out.tfevents.*"), key=os.path.getmtime):
        ea = EventAccumulator(path, size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in ea.Scalars(tag)})
    return out


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


class Stopped(BaseException):
    """SIGTERM (gpu_check.sh's outer `timeout`): the step under way is abandoned, its subprocess killed."""


def _stop(signum, frame) -> None:
    raise Stopped()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-dry-run", action="store_true", help="the same steps at toy size on the CPU")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_check"), help="logs, runs and table.md")
    parser.add_argument("--only", nargs="*", choices=list(SHARES), help="run only these steps, in this order")
    parser.add_argument(
        "--budget",
        type=float,
        help=f"the whole check's time in s (default {BUDGET_S}; "
        f"{DRY_BUDGET_S} with --cpu-dry-run): every limit is derived from it",
    )
    parser.add_argument("--shell-budget", action="store_true", help="print gpu_check.sh's limits as shell assignments")
    args = parser.parse_args()
    budget = args.budget or (DRY_BUDGET_S if args.cpu_dry_run else BUDGET_S)
    if args.shell_budget:
        found = limits(budget)
        print(
            f"INSTALL_S={found['setup_install']} PREFLIGHT_S={found['setup_preflight']} STEPS_S={found['steps']} "
            f"KILL_GRACE_S={KILL_GRACE_S}"
        )
        return
    out = Path(args.out)
    shutil.rmtree(out / "runs", ignore_errors=True)  # a rerun on a warm machine starts clean (pinned run folders)
    for log in out.glob("*.log"):
        log.unlink()
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _stop)
    runner = Runner(out, args.cpu_dry_run, budget)
    if not args.cpu_dry_run and runner.gpus == 0:
        print("gpu_check: no GPU (use --cpu-dry-run to check the steps on the CPU)", file=sys.stderr)
        sys.exit(1)
    runner.header()
    steps = list(args.only or SHARES)
    try:
        for step in steps:
            start = time.perf_counter()
            runner.begin(step)
            try:
                getattr(runner, step)()
            except Exception as err:  # a broken step is a failed check, and the others still run
                runner.add(step, False, f"{type(err).__name__}: {err}"[:200], "", time.perf_counter() - start)
    except Stopped:
        runner.note(f"Stopped by SIGTERM during {step}; not run to the end: {', '.join(steps[steps.index(step) :])}.")
        runner.checks.append(Check(step, "FAIL", "stopped", "", 0.0))
    print((out / "table.md").read_text(), end="")
    sys.exit(1 if any(c.status == "FAIL" for c in runner.checks) else 0)


if __name__ == "__main__":
    main()
