"""The coordinate check (`loopnet coordcheck`, loopnet/diagnostics/coord_check.py) on the embedded corpus: μP's
curves of mean |x| against width stay flat within the seeds' band, the standard parametrization's grow; and the
command writes its CSVs, figures, report and TensorBoard images.

The band. For every quantity q (a visit's branch output or state, the embedding, an attention visit's logits, the
output logits) and step t, each seed i gives a slope s_i,q of log mean|x| against log d over d = 32 … 256, and the
seeds' range r_q = max_i s_i,q − min_i s_i,q says how far one seed's slope is from another's. The band of a step
is F·R_t with R_t = max_q r_q over the hidden quantities (embedding, branches, states) and F = 2:

    μP, hidden q, every step        |mean_i s_i,q| ≤ F·R_t              flat within the seeds' band
    μP, attention and output logits  mean_i s_i,q ≤ F·R_t               they may fall (∝ 1/√d at init), not grow
    standard, every branch, step 1  mean_i s_i,q > F·R_1(standard)      GPT-2's fixed init std: f(·) ∝ d^(1/2…1)
    standard, output logits, step 2 mean_i s_i > F·r_logits, and above μP's by F·(r_standard + r_μP)

Step 2 is after one AdamW step at lr 1e-2 (a rate at which the standard head's update, ∝ lr·d, outgrows its
initial logits at these widths). Three seeds, widths 32–256, R = 2, K = 2, batches of 4 × 32 bytes: ~20 s.
"""

import math

import pytest
import torch

from loopnet.data import TokenStreamDataModule
from loopnet.diagnostics.coord_check import mean_abs_attention_logit, run, slopes
from loopnet.model import LoopConfig, visit_order
from loopnet.training.options import OptimConfig

F = 2.0
WIDTHS = [32, 64, 128, 256]


@pytest.fixture(scope="module")
def measured():
    torch.set_num_threads(1)
    dm = TokenStreamDataModule(seq_len=32, batch_size=4, seed=0, vocab="bytes")
    dm.setup("fit")
    loader = iter(dm.train_dataloader())
    batches = [tuple(t.long() for t in next(loader)) for _ in range(3)]
    base = LoopConfig(
        vocab_size=320,
        seq_len=32,
        d_model=32,
        n_heads=4,
        n_blocks=2,
        n_rounds=2,
        residual="preln",
        tie_embeddings=False,
    )
    rows = run(
        base, OptimConfig(lr=1e-2), batches, ["standard", "mup"], WIDTHS, [2], [1, 2, 3], 1.0, log=lambda *_: None
    )
    return rows, slopes(rows)


def _hidden(q: str) -> bool:
    return q == "embedding" or q.split("/", 1)[0] in ("branch", "state")


def _band(summary, param: str, step: int) -> float:
    return F * max(
        max(s["per_seed"]) - min(s["per_seed"])
        for s in summary
        if (s["parametrization"], s["step"]) == (param, step) and _hidden(s["quantity"])
    )


def _get(summary, param, step, quantity):
    return next(s for s in summary if (s["parametrization"], s["step"], s["quantity"]) == (param, step, quantity))


def test_every_visit_is_measured_under_its_tag(measured):
    rows, _ = measured
    tags = {r["quantity"].split("/", 1)[1] for r in rows if "/" in r["quantity"]}
    visits = visit_order(2, 2)
    assert tags == {v.tag for v in visits}
    attn = {r["quantity"] for r in rows if r["quantity"].startswith("attn_logits/")}
    assert attn == {f"attn_logits/{v.tag}" for v in visits if v.sublayer == "attn"}
    assert {r["width"] for r in rows} == set(WIDTHS) and {r["step"] for r in rows} == {1, 2, 3}


def test_mup_stays_flat_within_the_seeds_band(measured):
    _, summary = measured
    for step in (1, 2, 3):
        band = _band(summary, "mup", step)
        for s in (s for s in summary if (s["parametrization"], s["step"]) == ("mup", step)):
            if _hidden(s["quantity"]):
                assert abs(s["slope"]) <= band, (step, s["quantity"], s["slope"], band)
            else:
                assert s["slope"] <= band, (step, s["quantity"], s["slope"], band)


def test_standard_grows_beyond_the_band(measured):
    _, summary = measured
    band = _band(summary, "standard", 1)
    branches = [
        s
        for s in summary
        if (s["parametrization"], s["step"]) == ("standard", 1) and s["quantity"].startswith("branch/")
    ]
    assert branches and all(s["slope"] > band for s in branches), [(s["quantity"], s["slope"]) for s in branches]
    sp, mup = _get(summary, "standard", 2, "logits"), _get(summary, "mup", 2, "logits")
    spread = lambda s: max(s["per_seed"]) - min(s["per_seed"])  # noqa: E731
    assert sp["slope"] > F * spread(sp), sp
    assert sp["slope"] - mup["slope"] > F * (spread(sp) + spread(mup)), (sp, mup)


def test_mean_abs_attention_logit_counts_the_causal_positions_only():
    q = torch.tensor([[[[1.0, 1.0], [0.0, 2.0]]]])  # B = H = 1, T = 2, d_h = 2
    k = torch.tensor([[[[3.0, 0.0], [0.0, -5.0]]]])
    # causal logits q_i·k_j/√2 for j ≤ i: (0,0) 3/√2, (1,0) 0, (1,1) −10/√2; the masked (0,1) = −5/√2 is not
    # counted
    assert mean_abs_attention_logit(q, k) == pytest.approx((3 + 0 + 10) / math.sqrt(2) / 3, rel=1e-6)


def test_command_writes_csvs_figures_report_and_tensorboard_images(tmp_path, capsys):
    import csv

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from loopnet.commands import main

    out = tmp_path / "cc"
    main(
        [
            "coordcheck",
            "--config",
            "configs/preln_r6.yaml",
            "--config",
            "configs/cpu.yaml",
            "--config",
            "configs/study_map.yaml",
            "--data.batch_size",
            "2",
            "--model.config.seq_len",
            "16",
            "--widths",
            "32",
            "64",
            "--rounds",
            "1",
            "2",
            "--seeds",
            "1",
            "2",
            "--steps",
            "2",
            "--lr",
            "1e-2",
            "--out",
            str(out),
        ]
    )
    assert "loopnet coordcheck:" in capsys.readouterr().out
    for name in ("coord_check.csv", "coord_slopes.csv", "coord_width.png", "coord_rounds.png", "report.md"):
        assert (out / name).stat().st_size > 0, name
    rows = list(csv.DictReader(open(out / "coord_check.csv")))
    assert {r["parametrization"] for r in rows} == {"standard", "mup", "completep"}
    assert {(r["rounds"], r["quantity"]) for r in rows} >= {("2", "branch/r02_k2_ffn"), ("1", "logits")}
    report = (out / "report.md").read_text()
    assert "![mean |x| against width](coord_width.png)" in report and "| completep | 2 | 2 |" in report
    images = EventAccumulator(str(out / "tb")).Reload().Tags()["images"]
    assert set(images) == {"coordcheck/width", "coordcheck/rounds"}


def test_command_refuses_bad_settings_before_training(tmp_path, capsys):
    from loopnet.commands import main

    with pytest.raises(SystemExit):
        main(["coordcheck", "--widths", "64", "--out", str(tmp_path / "x")])
    assert "--widths needs two or more" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
