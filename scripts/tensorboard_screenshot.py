"""Screenshot TensorBoard's opening view of a tiny real run: the README's picture of the depth profile.

    .venv/bin/python scripts/tensorboard_screenshot.py --out docs/images/tensorboard_depth_profile.png

1. Trains two tiny runs on the embedded Shakespeare corpus (DeepLoop and DeepNorm, K = 2, R = 6, the CPU
   overlay at d 64 for --steps steps, diagnostics every --every steps) with `loopnet fit`, then `loopnet
   test`s each (whose scalars join the fit's run), under loopnet's own run names, into a temporary
   folder, or into --logdir when it holds no runs yet (a folder of runs is shown as it is).
2. Starts TensorBoard on 127.0.0.1 at a free port and waits until its HTTP API lists the depth profile's
   images (``depth/...``): it follows the server's own progress, no fixed sleep.
3. Opens TensorBoard's start page in headless Chromium (apt-get install chromium) and saves a
   screenshot; Chromium is told to resolve no host but 127.0.0.1 and to make no background requests,
   so only this local TensorBoard is contacted.
4. Stops TensorBoard and writes the PNG with a reduced palette (small enough for the README).

What the screenshot shows is TensorBoard's default landing view (TIME SERIES), unchanged: it sorts tag
groups by name and opens the first two, which the ``depth`` group (before Lightning's ``epoch``) is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"deeploop": "configs/deeploop_r6.yaml", "deepnorm": "configs/deepnorm_r6.yaml"}


def train(logdir: Path, steps: int, every: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    for name, config in RUNS.items():
        common = [
            "--config",
            str(ROOT / config),
            "--config",
            str(ROOT / "configs/cpu.yaml"),
            "--model.config.d_model",
            "64",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.limit_test_batches",
            "2",
            "--trainer.logger.init_args.save_dir",
            str(logdir),
            "--trainer.enable_progress_bar",
            "false",
        ]
        fit = [
            "fit",
            *common,
            "--trainer.max_steps",
            str(steps),
            "--trainer.val_check_interval",
            str(steps),
            "--diagnostics.every_n_steps",
            str(every),
        ]
        test = ["test", *common, "--ckpt_path", "last"]  # its scalars join the fit's run: no run of its own
        for args in (fit, test):
            print(f"{args[0]} {name}: {steps} steps", flush=True)
            subprocess.run(
                [sys.executable, "-m", "loopnet", *args], env=env, check=True, cwd=ROOT, stdout=subprocess.DEVNULL
            )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_for_images(base: str, proc: subprocess.Popen, runs: int, timeout_s: float) -> None:
    """Until TensorBoard lists a depth image for `runs` runs (it loads event files in the background)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            tags = get_json(f"{base}/data/plugin/images/tags")
            if sum(any(t.startswith("depth/") for t in run_tags) for run_tags in tags.values()) >= runs:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    raise TimeoutError(f"tensorboard listed no depth/ images within {timeout_s:.0f} s")


def chromium() -> str:
    for name in ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("scripts/tensorboard_screenshot.py: error: no Chromium found; fix: apt-get install -y chromium")


def screenshot(url: str, out: Path, width: int, height: int, budget_ms: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "--force-device-scale-factor=1",
            # Only the local TensorBoard: no other host resolves, no background requests.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-default-apps",
            "--disable-extensions",
            "--metrics-recording-only",
            "--no-default-browser-check",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={out}",
            url,
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)


def shrink(path: Path, colors: int = 64) -> None:
    """A palette PNG: the UI has few colours, so this keeps it legible at a fraction of the size."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/images/tensorboard_depth_profile.png")
    p.add_argument("--logdir", help="a folder of runs to show; empty or new: the two tiny runs are trained into it")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20, help="diagnostics every n steps")
    p.add_argument("--size", type=int, nargs=2, default=(1280, 1000), metavar=("W", "H"))
    p.add_argument("--url-suffix", default="", help="appended to the start page's URL, e.g. '#images'")
    p.add_argument("--budget-ms", type=int, default=20000, help="Chromium's virtual time for the page")
    args = p.parse_args(argv)
    out = Path(args.out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(args.logdir) if args.logdir else Path(tmp) / "runs"
        if not any(logdir.rglob("events.out.tfevents.*")):
            train(logdir, args.steps, args.every)
        runs = len({f.parent for f in logdir.rglob("events.out.tfevents.*")})
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(logdir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--load_fast",
                "false",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for_images(base, proc, runs, timeout_s=300)
            screenshot(f"{base}/{args.url_suffix}", out, *args.size, args.budget_ms)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    shrink(out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
