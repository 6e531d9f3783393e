"""loopnet probe: the update-size test of DeepLoop's theory over R."""

import json
import math

import pytest

from loopnet.study import probe


@pytest.mark.parametrize(
    "scheme,decorrelated,aligned", [("postln", 1, 2), ("deepnorm", 0, 1), ("deeploop", -1, 0), ("p0.375", -0.5, 0.5)]
)
def test_theory_slopes_are_the_papers(scheme, decorrelated, aligned):
    rounds = [1, 2, 4, 8, 16, 32]
    for kappa, slope in ((lambda r: 1.0, decorrelated), (lambda r: float(r), aligned)):
        got = probe.fit_slope(rounds, [probe.theory(scheme, 2, r, kappa(r)) for r in rounds])
        assert got == pytest.approx(slope, abs=1e-9)
    assert probe.exponent(scheme) == pytest.approx((1 - decorrelated) / 4)
    # DeepLoop with aligned visits: M·R·(β/α)² = 1/(8K), the paper's bound
    assert probe.theory("deeploop", 2, 6, 6.0) == pytest.approx(1 / 16)


def test_bad_scheme_names_fail_clearly(capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--schemes", "deepnet", "--out", "unused"])
    assert exit_.value.code == 2
    assert "use postln, deepnorm, deeploop or p<exponent>" in capsys.readouterr().err


def test_probe_writes_measurements_plot_and_report(tmp_path):
    out = tmp_path / "probe"
    probe.main(
        [
            "--config",
            "configs/deeploop_r6.yaml",
            "--config",
            "configs/cpu.yaml",
            "--model.config.d_model",
            "32",
            "--model.config.n_heads",
            "2",
            "--model.config.seq_len",
            "16",
            "--data.batch_size",
            "2",
            "--rounds",
            "1",
            "2",
            "--schemes",
            "postln",
            "deeploop",
            "--seeds",
            "1",
            "--steps",
            "2",
            "--out",
            str(out),
        ]
    )
    data = json.loads((out / "probe.json").read_text())
    assert len(data["rows"]) == 2 * 2 * 1 * 2  # schemes x R x seeds x steps
    for row in data["rows"]:
        assert math.isfinite(row["output_change"]) and row["output_change"] > 0
        assert 0 < row["kappa"] <= row["rounds"] + 1e-4
        assert len(row["round_change"]) == row["rounds"]
        assert row["round_change"][-1] == row["output_change"]
    assert all(r["kappa"] == pytest.approx(1.0) for r in data["rows"] if r["rounds"] == 1)
    assert (out / "update_size.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "| postln | 0 |" in report and "| deeploop | 0.5 |" in report and "loopnet probe --config" in report


@pytest.mark.parametrize(
    "residual,p",
    [
        ("preln", None),
        ("postln", None),
        ("deepnorm", None),
        ("deeploop", None),
        ("scaled", 0.375),
        ("scaled", 0.4),
        ("scaled", 1.0),
    ],
)
def test_parse_scheme_inverts_scheme_label(residual, p):
    from loopnet.model.scales import parse_scheme, scheme_label

    assert parse_scheme(scheme_label(residual, p)) == (residual, p)


@pytest.mark.parametrize("name", ["scaled", "p0", "p-0.5", "px", "deepnet", ""])
def test_parse_scheme_refuses_names_of_no_scheme(name):
    from loopnet.model.scales import parse_scheme

    with pytest.raises(
        ValueError, match="names no residual scheme; use preln, postln, deepnorm, deeploop or p<exponent>"
    ):
        parse_scheme(name)


def test_the_probe_takes_no_preln():
    """Pre-LN has no exponent on the theory's α/β axis: the probe's schemes are the others."""
    assert probe.parse_scheme("p0.375") == ("scaled", 0.375)
    with pytest.raises(ValueError, match="--schemes 'preln': use postln, deepnorm, deeploop or p<exponent>"):
        probe.parse_scheme("preln")


def test_python_m_probe_runs_its_groups(tmp_path):
    """`python -m loopnet.study.probe`, as a process: --help, and --groups on a tiny model (its functions
    all defined before the module's entry point runs)."""
    import sys

    from tests.helpers import run_command
    from tests.reliability.helpers import ROOT, env

    helped = run_command([sys.executable, "-m", "loopnet.study.probe", "--help"], cwd=ROOT, env=env())
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert helped.stdout.startswith("usage: loopnet probe") and "--groups" in helped.stdout
    out = tmp_path / "groups"
    res = run_command(
        [
            sys.executable,
            "-m",
            "loopnet.study.probe",
            "--config",
            "configs/deeploop_r6.yaml",
            "--config",
            "configs/cpu.yaml",
            "--model.config.d_model",
            "16",
            "--model.config.n_heads",
            "2",
            "--model.config.seq_len",
            "8",
            "--data.batch_size",
            "1",
            "--groups",
            "--rounds",
            "1",
            "--schemes",
            "deeploop",
            "--seeds",
            "1",
            "--optimizers",
            "sgd",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env(),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads((out / "groups.json").read_text())["rows"]
    assert [(r["label"], r["rounds"], r["optimizer"]) for r in rows] == [("deeploop", 1, "sgd")]
    assert (out / "groups.png").is_file() and "| deeploop | 1 |" in (out / "report.md").read_text()
