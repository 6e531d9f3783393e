"""A stand-in for `python -m loopnet.training.cli fit ...` in sweep tests: what the sweep relies on of a
fit, in a fraction of a second instead of tens.

    python -m tests.study.fake_fit fit ... --trainer.logger.init_args.save_dir OUT --trainer.logger.init_args.name CELL

- first thing, appends its pid to ``OUT/pids`` (the test checks that none is alive once the sweep exited);
- holds the run folder's lock as a fit does (`loopnet.checkpoints.lock_version` on ``OUT/CELL``);
- "trains" for FAKE_FIT_SECONDS (default 0.6) in 20 ms steps, then writes a completed summary;
- SIGTERM or SIGHUP: writes an interrupted summary and exits 0 at the next step, as a fit does;
- FAKE_FIT_CRASH=CELL:abort|kill|exit,...: that cell dies of SIGABRT or SIGKILL, or exits with status 3, half way;
- FAKE_FIT_LINGER=S: after its completed summary, lingers S seconds with SIGTERM's default action back, as a fit's
  interpreter exits after Lightning restored the handlers (a SIGTERM then ends it with -SIGTERM, finished);
- FAKE_FIT_SEMAPHORE=1: holds a named semaphore, registered with multiprocessing's resource tracker as a real fit's
  are (released at exit).
"""

import os
import signal
import sys
import time
from pathlib import Path


def option(argv: list[str], key: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(key) + 1]  # the last one wins, as in jsonargparse


def main() -> None:
    argv = sys.argv[1:]
    out, name = (
        Path(option(argv, "--trainer.logger.init_args.save_dir")),
        option(argv, "--trainer.logger.init_args.name"),
    )
    with open(out / "pids", "a") as f:
        f.write(f"{os.getpid()}\n")
    stop = []
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda s, _: stop.append(s))

    from loopnet.checkpoints import lock_version, release_version_locks
    from loopnet.diagnostics import write_summary

    folder = out / name
    lock_version(folder)
    if os.environ.get("FAKE_FIT_SEMAPHORE"):
        import multiprocessing

        semaphore = multiprocessing.get_context("forkserver").Lock()  # noqa: F841 (held until exit)
    try:
        seconds = float(os.environ.get("FAKE_FIT_SECONDS", "0.6"))
        crash = dict(c.split(":") for c in os.environ.get("FAKE_FIT_CRASH", "").split(",") if c)
        t0, step = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            if stop:
                write_summary(folder / "summary.json", {"status": "interrupted", "global_step": step})
                print(f"fake fit: stopped at step {step}")
                return
            if crash.get(name) and time.monotonic() - t0 > seconds / 2:
                if crash[name] == "abort":
                    os.abort()
                if crash[name] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                sys.exit(3)
            time.sleep(0.02)
            step += 1
        write_summary(folder / "summary.json", {"status": "completed", "global_step": step, "final_val_loss": 1.0})
        print(f"fake fit: completed {step} steps", flush=True)
        linger = float(os.environ.get("FAKE_FIT_LINGER", "0"))
        if linger:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            time.sleep(linger)
    finally:
        release_version_locks()


if __name__ == "__main__":
    main()
