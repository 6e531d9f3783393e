"""The run folders a study commits: a sweep's finished cells, without checkpoints or event files, as one .tar.gz.

    python -m experiments.archive runs/sweeps/gamma_tail docs/results/gamma/tail_runs.tar.gz [--replace]

In: the sweep's manifest (sweep.json), its copy of the sweep file (sweep.yaml) and its log (sweep_log.jsonl), and
every cell folder whose run finished (`loopnet.study.sweep.is_finished`: completed or diverged), with its summary,
cell.json, config, hparams and fit log. Out: checkpoints (*.ckpt), TensorBoard event files, dotfiles (the sweep's
.locks) and unfinished cells. What is left is the text the readings read (`experiments.sources`), small enough to
commit. Owners are written as root (uid 0), so the archive does not carry this machine's user. Unpack it with
`tar -xzf <archive> -C runs/sweeps`; the folder inside is named as the sweep's.

An archive that exists is replaced only with --replace, and only once the new one is whole: it is written beside
it and then renamed over it, so a failure leaves the old one as it was.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
from pathlib import Path

from loopnet.env import one_line_errors
from loopnet.study.sweep import LOG, MANIFEST, is_finished

SWEEP_FILES = (MANIFEST, "sweep.yaml", LOG)


def kept(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """The tar filter: drop checkpoints, event files and dotfiles; write every owner as root."""
    name = Path(info.name).name
    if name.endswith(".ckpt") or name.startswith(("events.out.tfevents.", ".")):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def pack(sweep_dir: Path, out: Path, replace: bool = False) -> dict:
    """Write `out` from the finished cells of `sweep_dir`; returns {"cells": packed, "unfinished": left out}."""
    sweep_dir, out = Path(sweep_dir), Path(out)
    if not (sweep_dir / MANIFEST).is_file():
        raise FileNotFoundError(
            f"{sweep_dir} holds no {MANIFEST}, so it is not a sweep's run folder; fix: pass the `out` folder a "
            "`loopnet sweep` wrote (runs/sweeps/<name>)"
        )
    if not out.name.endswith(".tar.gz"):
        raise ValueError(f"{out}: the archive is gzip-compressed tar; fix: name it <something>.tar.gz")
    if out.exists() and not replace:
        raise ValueError(f"{out} exists; fix: pass --replace to write it anew from {sweep_dir}, or another path")
    cells = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    finished = [p for p in cells if is_finished(p)]
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.part")
    try:
        with tarfile.open(part, "w:gz", compresslevel=9) as tar:
            for name in SWEEP_FILES:
                if (sweep_dir / name).is_file():
                    tar.add(sweep_dir / name, arcname=f"{sweep_dir.name}/{name}", filter=kept)
            for cell in finished:
                tar.add(cell, arcname=f"{sweep_dir.name}/{cell.name}", filter=kept)
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    return {"cells": len(finished), "unfinished": len(cells) - len(finished)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m experiments.archive", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("sweep_dir", type=Path, help="the sweep's run folder (runs/sweeps/<name>)")
    p.add_argument("out", type=Path, help="the archive to write (.tar.gz)")
    p.add_argument("--replace", action="store_true", help="replace an archive that exists")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    with one_line_errors("loopnet archive", (ValueError, FileNotFoundError)):
        got = pack(args.sweep_dir, args.out, args.replace)
    print(
        f"loopnet archive: wrote {args.out}: {got['cells']} finished cell(s) of {args.sweep_dir}"
        + (f"; {got['unfinished']} unfinished left out" if got["unfinished"] else "")
        + f" ({args.out.stat().st_size / 1e3:.0f} kB)"
    )


if __name__ == "__main__":
    main()
