"""loopnet's forward of an imported model against the reference code's own forward, paired in one run.

    loopnet bench import-speed --format huginn|ouro|parcae --reference DIR [--python /tmp/ref-env/bin/python]
                               [--reps 5] [--dtypes float32,bfloat16] [--threads 1] [--<size> N ...]
                               [--out import-speed.md] [--json import-speed.json]
    loopnet bench huginn-speed ...   the same with --format huginn

DIR holds the reference's code; nothing of it is part of loopnet:

    huginn   raven_modeling_minimal.py and raven_config_minimal.py: a seal-rg/recurrent-pretraining checkout's
             recpre/ (or the checkout), or a Hugging Face folder with Huginn's remote code
    ouro     modeling_ouro.py and configuration_ouro.py: a LoopedLMs/ouro_rl checkout's ouro_rl/modeling/ (or the
             checkout), or a Hugging Face folder with Ouro's remote code
    parcae   the parcae_lm package: a SandyResearch/parcae checkout (or its parcae_lm/)

Huginn's and Ouro's remote code need transformers 4.5x (Parcae's runs under either): `--python` names an
interpreter that has it (and torch); loopnet's model (torch only) runs under the same interpreter, in the same process.

The model: a random checkpoint in the format's hub layout (`loopnet.bench.hub_checkpoints`) at a size where the
blocks dominate (SIZES; each can be changed with --<key> N), fp32, R = 4 rounds, one sequence of `seq_len` tokens:
    huginn   d 1024, 16 heads, FFN 2816 (SwiGLU), prelude 1, core 2, coda 1, vocabulary 8192, 256 tokens
    ouro     d 1024, 8 heads, FFN 2816 (SwiGLU), 2 layers looped, vocabulary 8192, 256 tokens
    parcae   d 1024, 8 heads, FFN 4096 (ReLU²), prelude 1, core 2, coda 1, vocabulary 8192, 256 tokens
Both models read the same files, each in the dtype timed: the reference through its own loader (Huginn's and Ouro's
`from_pretrained`; Parcae's `ParcaeConfig(**config.json).construct_model()`, its model.pt loaded and the model cast,
as parcae_lm.from_pretrained does from the hub), loopnet through the format's reader (`read_huginn`, `read_ouro`,
`read_parcae`) and `build_network`.

Pairing: one child process, both models loaded, `torch.set_num_threads(--threads)`; per dtype, after a warm-up forward
of each, `reps` turns, each turn one timed forward of each (`torch.no_grad()`, the order alternating per turn), each
side as its users call it at R rounds: Huginn `num_steps=R` and loopnet `rounds=R`, both from their random initial
state; Ouro with `total_ut_steps = R`, no cache and `use_weighted_exit` (the exit gate's expected logits
Σ_t p_t·head(h_t), what loopnet's forward of an imported Ouro returns: both run the head once a round); Parcae
`num_steps_pair=(R, 0)` from its random (like-init) state. Reported: each side's median time, the median of the
per-turn ratios loopnet / reference (< 1: loopnet faster), and the same ratio in CPU time (`time.process_time`, which
counts none of the time other processes hold the cores: the figure to read on a shared machine). A check first: at
fp32, from the zero initial state, the two logits agree to CHECK_RTOL of their scale (else the bench stops: the two
would not be the same model).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROUNDS = 4
# fp32's unit roundoff (6e-8) grown through ~10 block visits of length-d sums (√d ≈ 32 each) stays under 1e-4 of
# the logits' scale; a weight read wrong or a different computation moves them by far more.
CHECK_RTOL = 1e-4
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Reference:
    """Where a format's reference code stands in --reference DIR, and under what name the child imports it."""

    package: str  # the name the child imports it as
    files: tuple[str, ...]  # what it needs, relative to its folder
    places: tuple[str, ...]  # its folder, relative to DIR, tried in order
    whole: bool  # copy the whole folder (a package with absolute imports), else just `files`
    what: str  # the fix: what DIR should be


REFERENCES = {
    "huginn": Reference(
        "huginn_reference",
        ("raven_modeling_minimal.py", "raven_config_minimal.py"),
        (".", "recpre"),
        False,
        "a seal-rg/recurrent-pretraining checkout or a folder with Huginn's remote code",
    ),
    "ouro": Reference(
        "ouro_reference",
        ("modeling_ouro.py", "configuration_ouro.py"),
        (".", "ouro_rl/modeling"),
        False,
        "a LoopedLMs/ouro_rl checkout or a folder with Ouro's remote code",
    ),
    "parcae": Reference(
        "parcae_lm",
        ("__init__.py", "models/parcae/parcae.py", "models/parcae/config.py"),
        ("parcae_lm", "."),
        True,
        "a SandyResearch/parcae checkout or its parcae_lm/ folder",
    ),
}
SIZES = {  # each format's checkpoint: the blocks dominate
    "huginn": {
        "n_embd": 1024,
        "n_heads": 16,
        "intermediate_size": 2816,
        "vocab_size": 8192,
        "block_size": 256,
        "n_layers_in_prelude": 1,
        "n_layers_in_recurrent_block": 2,
        "n_layers_in_coda": 1,
    },
    "ouro": {
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 2816,
        "vocab_size": 8192,
        "max_position_embeddings": 256,
        "num_hidden_layers": 2,
        "total_ut_steps": ROUNDS,
    },
    "parcae": {
        "n_embd": 1024,
        "num_attention_heads": 8,
        "intermediate_size": 4096,
        "vocab_size": 8192,
        "block_size": 256,
        "n_layers_in_prelude": 1,
        "n_layers_in_recurrent_block": 2,
        "n_layers_in_coda": 1,
    },
}
SIZE_KEYS = sorted({key for sizes in SIZES.values() for key in sizes})


def reference_package(fmt: str, reference: Path, into: Path) -> None:
    """The format's reference code from `reference` as the package `REFERENCES[fmt].package` under `into`."""
    ref = REFERENCES[fmt]
    folders = [reference / place for place in ref.places]
    found = next((f for f in folders if all((f / name).is_file() for name in ref.files)), None)
    if found is None:
        missing = [name for name in ref.files if not (folders[0] / name).is_file()]
        raise SystemExit(
            f"loopnet bench import-speed: {folders[0]} holds no {', '.join(missing)}, nor does "
            f"{' or '.join(str(f) for f in folders[1:])}; fix: give --reference {ref.what}"
        )
    target = into / ref.package
    if ref.whole:
        shutil.copytree(found, target, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        target.mkdir()
        (target / "__init__.py").write_text("")
        for name in ref.files:
            shutil.copyfile(found / name, target / name)


def load_reference(fmt: str, folder: str, dtype, rounds: int):
    """The reference's model of the checkpoint `folder` in `dtype`, eval mode, set to run `rounds` rounds."""
    import torch

    if fmt == "huginn":
        modeling = importlib.import_module("huginn_reference.raven_modeling_minimal")
        return modeling.RavenForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    if fmt == "ouro":
        modeling = importlib.import_module("ouro_reference.modeling_ouro")
        model = modeling.OuroForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        model.model.total_ut_steps = rounds
        model.early_exit_threshold = None  # else its exit threshold would pick the logits, not use_weighted_exit
        return model
    config_module = importlib.import_module("parcae_lm.models.parcae.config")
    config = json.loads((Path(folder) / "config.json").read_text())
    for key in ("_class_name", "rope_settings"):  # as parcae_lm.from_pretrained reads the hub's config.json
        config.pop(key)
    model = config_module.ParcaeConfig(**config).construct_model()
    missing, unexpected = model.load_state_dict(torch.load(Path(folder) / "model.pt", weights_only=True), strict=False)
    if missing or unexpected:
        raise SystemExit(f"the reference left {missing} unfilled and {unexpected} unused: the checkpoint is not its")
    return model.to(dtype=dtype).eval()


def reference_logits(fmt: str, model, ids, rounds: int, zero_state: bool):
    """The reference's forward as its users call it (`zero_state`: from the zero initial state)."""
    import torch

    if fmt == "huginn":
        zeros = {"input_states": torch.zeros(*ids.shape, model.config.n_embd)} if zero_state else {}
        return model(ids, num_steps=rounds, **zeros).logits
    if fmt == "ouro":  # the exit gate's expected logits, which loopnet's forward of an imported Ouro returns
        return model(ids, use_cache=False, use_weighted_exit=True).logits
    state_init = model.config.state_init
    model.config.state_init = "zero" if zero_state else state_init
    try:
        return model(ids, return_logits=True, num_steps_pair=torch.tensor([rounds, 0]))["logits"]
    finally:
        model.config.state_init = state_init


def child(argv: list[str]) -> dict:
    """The timing process: FORMAT FOLDER REPS DTYPES THREADS ROUNDS; its reference package on sys.path."""
    import dataclasses

    import torch

    from loopnet.checkpoints import build_network
    from loopnet.formats import huginn, ouro, parcae

    fmt, folder, reps, dtypes, threads, rounds = argv[0], argv[1], int(argv[2]), argv[3], int(argv[4]), int(argv[5])
    torch.set_num_threads(threads)
    readers = {"huginn": huginn.read_huginn, "ouro": ouro.read_ouro, "parcae": parcae.read_parcae}
    cfg, state, _ = readers[fmt](folder)
    ids = torch.randint(0, 256, (1, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    try:
        import transformers

        version = transformers.__version__
    except ImportError:  # Parcae's code runs without it
        version = None
    out = {"transformers": version, "torch": torch.__version__, "threads": threads, "dtypes": {}}
    out["model"] = {k: getattr(cfg, k) for k in ("d_model", "n_heads", "ffn_width", "mlp", "vocab_size", "seq_len")}
    out["model"] |= {"n_prelude": cfg.n_prelude, "n_blocks": cfg.n_blocks, "n_coda": cfg.n_coda}

    def timed(f) -> tuple[float, float]:
        """(wall-clock, CPU) seconds of f: the CPU time of the process's threads counts none of the time the
        machine's other processes take from it, the wall-clock time does."""
        t, c = time.perf_counter(), time.process_time()
        with torch.no_grad():
            f()
        return time.perf_counter() - t, time.process_time() - c

    ref = load_reference(fmt, folder, torch.float32, rounds)
    ours = build_network(dataclasses.replace(cfg, state_init="zero"), state, dtype=torch.float32)
    with torch.no_grad():
        a = reference_logits(fmt, ref, ids, rounds, zero_state=True).float()
        b = ours(ids, rounds=rounds)[0].float()
    out["max_abs_logit_diff_fp32"] = float((a - b).abs().max())
    out["logit_scale"] = float(a.abs().max())
    config = getattr(ref, "config", None)  # the attention the reference runs (transformers' or Parcae's attn_impl)
    out["attention"] = getattr(config, "_attn_implementation", None) or getattr(config, "attn_impl", None)
    if not out["max_abs_logit_diff_fp32"] <= CHECK_RTOL * out["logit_scale"]:
        raise SystemExit(
            f"loopnet bench import-speed: at fp32 the logits differ by {out['max_abs_logit_diff_fp32']:.3g} "
            f"(scale {out['logit_scale']:.3g}): loopnet's import and the reference compute different models; fix: "
            f"give the reference at the commit docs/benchmarks/import.md names"
        )
    del ref, ours

    for name in dtypes.split(","):
        dtype = getattr(torch, name)
        ref = load_reference(fmt, folder, dtype, rounds)
        ours = build_network(cfg, state, dtype=dtype)
        run = {
            "reference": functools.partial(reference_logits, fmt, ref, ids, rounds, zero_state=False),
            "loopnet": functools.partial(ours, ids, rounds=rounds),
        }
        for f in run.values():
            timed(f)  # warm-up
        times: dict[str, list[float]] = {k: [] for k in run}
        cpu: dict[str, list[float]] = {k: [] for k in run}
        for turn in range(reps):
            for k in ("reference", "loopnet") if turn % 2 == 0 else ("loopnet", "reference"):
                wall, used = timed(run[k])
                times[k].append(wall)
                cpu[k].append(used)
            print(
                f"[bench import-speed] {fmt} {name} turn {turn + 1}/{reps}: reference {times['reference'][-1]:.3f} s, "
                f"loopnet {times['loopnet'][-1]:.3f} s",
                file=sys.stderr,
                flush=True,
            )
        ratios = [ours_t / ref_t for ours_t, ref_t in zip(times["loopnet"], times["reference"], strict=True)]
        cpu_ratios = [ours_t / ref_t for ours_t, ref_t in zip(cpu["loopnet"], cpu["reference"], strict=True)]
        out["dtypes"][name] = {
            "reference": statistics.median(times["reference"]),
            "loopnet": statistics.median(times["loopnet"]),
            "ratio": statistics.median(ratios),
            "ratios": ratios,
            "cpu_ratio": statistics.median(cpu_ratios),
            "cpu_ratios": cpu_ratios,
            "times": times,
            "cpu_times": cpu,
        }
        del run, ref, ours
    return out


def run(fmt: str, reference: str, python: str, reps: int, dtypes: str, threads: int, sizes: dict) -> dict:
    import torch

    from loopnet.bench.hub_checkpoints import write_checkpoint
    from loopnet.env import machine

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory(prefix=f"loopnet-bench-{fmt}-speed-") as tmp:
        tmp = Path(tmp)
        reference_package(fmt, Path(reference), tmp)
        folder = tmp / fmt
        made = write_checkpoint(folder, sizes, dtype=torch.float32, fmt=fmt)
        root = str(Path(__file__).resolve().parents[2])
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(tmp), root, os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": str(threads),
        }
        code = "import json, sys; from loopnet.bench.import_speed import child; print(json.dumps(child(sys.argv[1:])))"
        args = [fmt, str(folder), str(reps), dtypes, str(threads), str(ROUNDS)]
        proc = subprocess.run([python, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"loopnet bench import-speed: the timing process failed (exit {proc.returncode}); see above")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    return res | {
        "format": fmt,
        "parameters": made["parameters"],
        "sizes": sizes,
        "rounds": ROUNDS,
        "reps": reps,
        "python": python,
        "machine": machine(),
        "load_average": load,
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
    }


def markdown(res: dict, command: str) -> str:
    m, load = res["model"], res["load_average"]
    head = (
        f"`{command}`: {res['format']}, {res['parameters'] / 1e6:.0f} M parameters (d {m['d_model']}, "
        f"{m['n_heads']} heads, FFN {m['ffn_width']} {m['mlp']}, P {m['n_prelude']} + K {m['n_blocks']}·R "
        f"{res['rounds']} + C {m['n_coda']}, vocabulary {m['vocab_size']}), one sequence of {m['seq_len']} tokens, "
        f"{res['reps']} paired turns, {res['threads']} thread(s), torch {res['torch']}, transformers "
        f"{res['transformers']}, the reference's attention {res['attention'] or 'its own'}, {res['date']}, load "
        f"average at start {'?' if load is None else f'{load:.1f}'}. Check at fp32 from the zero state: largest "
        f"|Δ logit| {res['max_abs_logit_diff_fp32']:.2e} (logits up to {res['logit_scale']:.1f})."
    )
    lines = [
        head,
        "",
        "| dtype | reference (median) | loopnet (median) | loopnet / reference (median of turns) "
        "| the same in CPU time | per-turn ratios |",
    ]
    lines.append("|---|---:|---:|---:|---:|---|")
    for name, r in res["dtypes"].items():
        turns = ", ".join(f"{x:.2f}" for x in r["ratios"])
        lines.append(
            f"| {name} | {r['reference']:.3f} s | {r['loopnet']:.3f} s | {r['ratio']:.3f} | {r['cpu_ratio']:.3f} "
            f"| {turns} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> tuple[argparse.Namespace, dict]:
    """The arguments and the checkpoint's sizes (the format's SIZES with the --<key> given)."""
    p = argparse.ArgumentParser(
        prog="loopnet bench import-speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--format", required=True, choices=sorted(REFERENCES), help="the imported format timed")
    p.add_argument("--reference", required=True, help="the folder of the reference's code (see above)")
    p.add_argument("--python", default=sys.executable, help="an interpreter with the reference's transformers, torch")
    p.add_argument("--reps", type=int, default=5, help="paired turns per dtype (default 5)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="the dtypes timed (default float32,bfloat16)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides (default 1)")
    for key in SIZE_KEYS:
        p.add_argument(
            f"--{key}",
            type=int,
            help=f"another {key} (a size of " + ", ".join(fmt for fmt, sizes in SIZES.items() if key in sizes) + ")",
        )
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    for name in args.dtypes.split(","):
        if name not in DTYPES:
            p.error(f"--dtypes: {name!r} is none of {', '.join(DTYPES)}; give a comma-separated list of them")
    given = {key: getattr(args, key) for key in SIZE_KEYS if getattr(args, key) is not None}
    foreign = sorted(set(given) - set(SIZES[args.format]))
    if foreign:
        p.error(
            f"{', '.join('--' + k for k in foreign)} sizes no {args.format} checkpoint; its sizes: "
            f"{', '.join('--' + k for k in SIZES[args.format])}"
        )
    return args, SIZES[args.format] | given


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, sizes = parse(argv)
    res = run(args.format, args.reference, args.python, args.reps, args.dtypes, args.threads, sizes)
    text = markdown(res, " ".join(["loopnet bench import-speed", *argv]))
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
