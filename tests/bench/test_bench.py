"""The benchmark runs (smoke mode: tiny sizes, one or two steps per variant) so it cannot rot.
Its numbers are machine- and load-dependent and are not asserted."""

import json
import os
import sys

import pytest
import torch

from tests.helpers import run_command

pytestmark = pytest.mark.slow

VARIANTS = [
    "bare",
    "lightning",
    "diagnostics@2",
    "diagnostics@50",
    "compile",
    "checkpoint",
    "R=1",
    "R=3",
    "R=12",
    "data",
    "nanoGPT",
    "preln R=1",
]


# The bench run with keep_freed_memory() counted: every call of it, by main() or a Trainer's HostMemory.
COUNTED = (
    "import sys\n"
    "import loopnet.training.host_memory as hm\n"
    "calls = []\n"
    "real = hm.keep_freed_memory\n"
    "hm.keep_freed_memory = lambda: calls.append(1) or real()\n"
    "import loopnet.bench.run as run\n"
    "run.keep_freed_memory = hm.keep_freed_memory\n"
    "run.main(sys.argv[1:])\n"
    "print('CALLS', len(calls))\n"
)


def counted_run(*args):
    proc = run_command([sys.executable, "-c", COUNTED, *args], env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`loopnet bench --smoke`, keep_freed_memory() counted: its stdout, markdown and JSON files."""
    folder = tmp_path_factory.mktemp("smoke")
    md, js = folder / "bench.md", folder / "bench.json"
    return counted_run("--smoke", "--out", str(md), "--json", str(js)).stdout, md, js


def test_smoke_run_prints_and_writes_every_variant(smoke):
    stdout, md, js = smoke
    for text in (stdout, md.read_text()):
        for name in VARIANTS:
            assert f"| {name} |" in text, f"no row for {name}"
        assert "Command: `loopnet bench --smoke" in text and "Peak for MFU" in text and "| K | R |" in text
    result = json.loads(js.read_text())
    assert {r["name"] for r in result["rows"]} >= set(VARIANTS) - {"compile"}
    assert set(result["checks"]) >= {"lightning", "diagnostics@50", "checkpoint", "rounds", "data", "mfu", "nanogpt"}


def test_vs_nanogpt_runs_the_pair_alone_at_equal_size(tmp_path):
    """--vs-nanogpt: loopnet's Pre-LN R = 1 step and the independent GPT's, of the same parameter count, in
    paired turns, and nothing else."""
    from loopnet.bench.run import parse
    from loopnet.bench.variants import Bare, NanoGPTStep

    js = tmp_path / "bench.json"
    proc = run_command(
        [sys.executable, "-m", "loopnet.bench.run", "--smoke", "--vs-nanogpt", "--steps", "3", "--json", str(js)],
        env=os.environ | {"CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loopnet Pre-LN K=2 R=1 against nanoGPT with 2 layers" in proc.stdout
    result = json.loads(js.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"nanoGPT", "preln R=1"} and rows["preln R=1"]["baseline"] == "nanoGPT"
    assert len(rows["preln R=1"]["samples_ms"]) == len(rows["nanoGPT"]["samples_ms"]) == 3  # one per turn
    assert result["checks"]["nanogpt"]["detail"].startswith(f"loopnet's step {rows['preln R=1']['ratio']:.2f}×")
    threads = torch.get_num_threads()
    try:
        _, s = parse(["--smoke", "--device", "cpu", "--vs-nanogpt"])
        gpt, loop = NanoGPTStep(s, None), Bare(s, s.config(n_rounds=1, residual="preln"))
    finally:
        torch.set_num_threads(threads)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(gpt.model) == count(loop.model)  # equal size: loopnet's RMSNorm and the GPT's bias-free LayerNorm


@pytest.fixture(scope="module")
def bf16_system(tmp_path_factory):
    """`loopnet bench --smoke --precision bf16 --system-malloc` (memory, data and all but one R' off),
    keep_freed_memory() counted: its stdout and JSON file. The bf16 and the system-malloc tests read it."""
    js = tmp_path_factory.mktemp("bf16") / "bench.json"
    flags = ["--smoke", "--precision", "bf16", "--no-memory", "--no-data", "--rounds", "6", "--system-malloc"]
    return counted_run(*flags, "--json", str(js)).stdout, js


def test_bf16_on_cpu_runs_autocast_and_measures_a_bf16_peak(bf16_system):
    """--precision bf16 on CPU: every variant in bf16 autocast (Lightning: bf16-mixed), MFU against
    this CPU's own bf16 matmul rate."""
    stdout, js = bf16_system
    assert "T=32, batch 2, vocabulary 256, bf16 autocast" in stdout
    result = json.loads(js.read_text())
    assert result["settings"]["bf16"] is True and result["peak_method"].startswith("this CPU's bf16")
    assert {"bare", "lightning", "checkpoint"} <= {r["name"] for r in result["rows"]}


def test_bare_loop_forward_runs_in_the_chosen_precision():
    from loopnet.bench.run import parse
    from loopnet.bench.settings import random_batches
    from loopnet.bench.variants import Bare

    threads = torch.get_num_threads()  # parse() sets 1 thread for --smoke
    try:
        for flag, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            _, s = parse(["--smoke", "--device", "cpu", "--precision", flag])
            runner = Bare(s, s.config())
            x, y = random_batches(s, 1)[0]
            with runner.autocast:
                logits, _ = runner.model(x, y)
            assert logits.dtype == dtype
    finally:
        torch.set_num_threads(threads)


def test_system_malloc_leaves_the_allocator_alone(smoke, bf16_system):
    """--system-malloc: no keep_freed_memory() in the bench process, nor through a Trainer's HostMemory;
    without it (the smoke run), main() and every Trainer apply it (the control: the count is not zero by
    accident)."""
    tuned, system = smoke[0], bf16_system[0]
    assert "CALLS 0" not in tuned and "keep_freed_memory(), applied" in tuned and "| system malloc |" in tuned
    assert "CALLS 0" in system and "keep_freed_memory(), NOT applied" in system
    assert "| system malloc |" not in system and "| lightning |" in system


def test_step_memory_and_trainers_follow_the_precision(monkeypatch):
    """bf16 autocast reaches the memory measurement (smaller saved activations than fp32), the
    Trainers (precision bf16-mixed) and the system-malloc child's settings."""
    from dataclasses import asdict

    import lightning as L

    from loopnet.bench import run

    threads = torch.get_num_threads()
    try:
        settings = {
            flag: run.parse(["--smoke", "--device", "cpu", "--precision", flag])[1] for flag in ("bf16", "fp32")
        }
    finally:
        torch.set_num_threads(threads)
    saved = {}
    for flag, s in settings.items():
        cfg = s.config(d_model=64, seq_len=64)
        s.seq_len = 64
        saved[flag] = run.step_memory(s, cfg, run.random_batches(s, 1)[0])["saved"]
    assert saved["bf16"] < saved["fp32"]
    assert run.Settings(**asdict(settings["bf16"])).bf16 is True

    seen = []

    class Stop(Exception):
        pass

    def fake_trainer(*args, precision, **kwargs):
        seen.append(precision)
        raise Stop

    monkeypatch.setattr(L, "Trainer", fake_trainer)
    for s in settings.values():
        lit = run.Lit(s, s.config(), "/nonexistent", "x")
        try:
            lit.run([], 1, 1)
        except Stop:
            pass
    assert seen == ["bf16-mixed", "32-true"]


def test_generation_bench_measures_every_path_on_the_same_tokens(tmp_path):
    """`loopnet bench generation` at a small size: the three paths run, give the same greedy tokens, and the
    table and JSON carry what was measured (tokens/s of each, the paired ratios and their median, the compile)."""
    import json

    from loopnet.bench import generation

    out, js = tmp_path / "g.md", tmp_path / "g.json"
    generation.main(
        [
            "--reps",
            "2",
            "--prompt",
            "4",
            "--new",
            "6",
            "--d_model",
            "64",
            "--seq_len",
            "16",
            "--rounds",
            "2",
            "--out",
            str(out),
            "--json",
            str(js),
        ]
    )
    res = json.loads(js.read_text())
    assert res["same_tokens"] is True and res["new_tokens"] == 6 and len(res["ratios"]) == 2
    assert res["model"]["d_model"] == 64 and res["model"]["n_heads"] == 2 and res["model"]["seq_len"] == 16
    assert res["model"]["n_rounds"] == 2  # R = 2: a third of R = 6's visits in the compiled step's graph
    assert res["ratio"] == pytest.approx(sum(res["ratios"]) / 2)  # the median of two
    assert res["cache_tokens_per_s"] > 0 and res["recompute_tokens_per_s"] > 0
    assert res["compiled_same_tokens"] is True and len(res["compiled_ratios"]) == 2 and res["compile_s"] > 0
    assert res["compiled_ratio"] == pytest.approx(sum(res["compiled_ratios"]) / 2)
    table = out.read_text()
    assert "| generate, KV cache across rounds |" in table and "| generate, KV cache, compiled step" in table
    generation.main(
        [
            "--reps",
            "1",
            "--prompt",
            "4",
            "--new",
            "2",
            "--d_model",
            "64",
            "--seq_len",
            "16",
            "--no-compile",
            "--json",
            str(js),
        ]
    )
    assert "compiled_ratio" not in json.loads(js.read_text())
