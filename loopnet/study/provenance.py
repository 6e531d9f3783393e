"""Where a study's numbers came from: the code's commit and the machine, as the reports write them."""

from __future__ import annotations

from pathlib import Path


def git_commit() -> str | None:
    import subprocess

    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.CalledProcessError):
        return None


def machine_line(info: dict | None) -> str:
    if not info:
        return "unknown (no manifest)"
    gpus = f", GPUs: {', '.join(info['gpus'])}" if info.get("gpus") else ", no GPU"
    return (
        f"{info.get('cpus')} CPU cores ({info.get('cpu')}){gpus}; {info.get('platform')}; "
        f"Python {info.get('python')}, torch {info.get('torch')}"
    )
