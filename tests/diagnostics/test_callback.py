"""VisitDiagnostics in a real (tiny) Lightning fit: tags in the event files, read back with
TensorBoard's EventAccumulator and over a real `tensorboard` server's HTTP API."""

import json
import socket
import subprocess
import sys
import urllib.request

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from loopnet.diagnostics import VisitDiagnostics, expected_scalar_tags, parse_tag
from loopnet.diagnostics.profile import LABELS, VIEWS, depth_profile, view_figure
from loopnet.diagnostics.tags import ATTN_QUANTITIES, OUTPUT_QUANTITIES, VISIT_QUANTITIES
from loopnet.model import Visit, visit_order
from loopnet.training.module import LoopedLM
from tests.helpers import wait_until

from .helpers import random_tokens, tiny_module, trainer
from .reference import expected_values, visit_gradients

pytestmark = pytest.mark.slow

K, R, EVERY, STEPS, CLIP = 2, 3, 2, 5, 1e-4


class SpyLM(LoopedLM):
    """Records, per step, whether an observer was attached during the forward."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.attached_at: dict[int, bool] = {}
        self.attached_in_validation = False

    def training_step(self, batch, batch_idx):
        self.attached_at[self.global_step] = self.model.observer is not None
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.attached_in_validation |= self.model.observer is not None
        return super().validation_step(batch, batch_idx)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diag")
    module = tiny_module(SpyLM)
    diagnostics = VisitDiagnostics(every_n_steps=EVERY)
    t = trainer(tmp, [diagnostics], max_steps=STEPS, gradient_clip_val=CLIP)
    t.fit(module, random_tokens(), random_tokens(8, seed=1))
    acc = EventAccumulator(t.log_dir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return t, module, diagnostics, acc


def test_observer_only_on_logging_steps(fitted):
    _, module, _, _ = fitted
    assert module.attached_at == {s: s % EVERY == 0 for s in range(STEPS)}
    assert not module.attached_in_validation and module.model.observer is None


def test_event_files_hold_every_expected_tag(fitted):
    _, _, _, acc = fitted
    scalars = set(acc.Tags()["scalars"])
    expected = expected_scalar_tags(K, R)
    # 5 quantities per visit, 3 more per attention visit, 3 per physical sublayer, 2 global, 2 output,
    # update/output_change, logit_change and per round
    assert len(expected) == 5 * 2 * K * R + 3 * K * R + 3 * 2 * K + 2 + 2 + (2 + R)
    assert set(expected) <= scalars, sorted(set(expected) - scalars)
    for tag in expected:
        assert [e.step for e in acc.Scalars(tag)] == [0, 2, 4], tag
    assert "visits/resid_norm/r03_k1_attn" in scalars
    hists = set(acc.Tags()["histograms"])
    assert {f"hist/{q}/r{r:02d}" for q in ("state", "token_rms") for r in (1, 2, 3)} <= hists
    for tag in expected:
        parse_tag(tag)  # the report can parse every tag back


def test_logged_values_are_sane(fitted):
    _, _, diagnostics, acc = fitted
    last = lambda tag: acc.Scalars(tag)[-1].value  # noqa: E731
    # Step 0 against the model unrolled by hand, from the same initial weights and first batch: every
    # per-visit gradient norm, κ̂ per sublayer and model-wide, the sublayer and global gradient norms.
    grads, others = visit_gradients(tiny_module().model, list(random_tokens())[:1])
    for tag, value in expected_values(grads, others).items():
        assert acc.Scalars(tag)[0].step == 0
        assert acc.Scalars(tag)[0].value == pytest.approx(value, rel=1e-4), tag  # fp32 sums vs float64
    for j in ("k1_attn", "k1_ffn", "k2_attn", "k2_ffn"):
        assert 0 < last(f"sublayers/kappa/{j}") <= R + 1e-4
        assert last(f"sublayers/update_ratio/{j}") > 0
    # Gradients were clipped to CLIP: the logged global norm is the one before clipping.
    assert last("grad/global_norm") > 100 * CLIP
    # DeepLoop's Norm after every visit: the state has unit RMS at init (RMSNorm gain 1), so its deviation is ~0.
    assert last("visits/state_norm_dev/r02_k1_ffn") == pytest.approx(0.0, abs=0.05)
    assert not [tag for tag in acc.Tags()["scalars"] if "/state_norm/" in tag]  # no chart constant by construction
    stats = diagnostics.last_stats
    assert stats["step"] == 4 and set(stats["visits"]) == {v.tag for v in map(Visit.parse, stats["visits"])}
    assert len(stats["visits"]) == 2 * K * R and stats["kappa"]["model"] == pytest.approx(last("grad/kappa_model"))
    assert set(stats["visits"]["r03_k2_attn"]) == set(VISIT_QUANTITIES + ATTN_QUANTITIES)
    assert set(stats["visits"]["r03_k2_ffn"]) == set(VISIT_QUANTITIES)
    assert stats["visits"]["r03_k2_attn"]["attn_logit_max"] == pytest.approx(last("visits/attn_logit_max/r03_k2_attn"))
    assert set(stats["output"]) == set(OUTPUT_QUANTITIES)
    assert stats["output"]["log_z"] == pytest.approx(last("output/log_z"))


def test_per_round_charts_hold_that_rounds_visits(fitted):
    """The custom chart of a quantity overlaid all 2·K·R visits on one linear axis; each
    round now has a category whose charts hold only its 2·K visits (K for the attention quantities). Issue
    23: no chart mixes more than one round's visits (the 'visits' category held 2·K·R visits per run)."""
    import re

    from tensorboard.plugins.custom_scalar import layout_pb2

    _, _, _, acc = fitted
    (config,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    categories = {c.title: c for c in layout.category}
    assert [t for t in categories if t.startswith("round")] == ["round 01", "round 02", "round 03"]
    assert list(categories)[0] == "training"
    scalars = acc.Tags()["scalars"]
    for r in (1, 2, 3):
        charts = {c.title: list(c.multiline.tag) for c in categories[f"round {r:02d}"].chart}
        assert sorted(charts) == sorted(f"{q} r{r:02d}" for q in VISIT_QUANTITIES + ATTN_QUANTITIES)
        for q in VISIT_QUANTITIES + ATTN_QUANTITIES:
            matched = sorted(t for t in scalars if any(re.match(rx, t) for rx in charts[f"{q} r{r:02d}"]))
            sublayers = ("attn",) if q in ATTN_QUANTITIES else ("attn", "ffn")
            assert matched == sorted(
                f"visits/{q}/{v.tag}" for v in visit_order(K, R) if v.round == r and v.sublayer in sublayers
            )
    # re.match, as TensorBoard's custom-scalars plugin selects a chart's tags (a prefix match).
    for category in layout.category:  # every chart of every category: at most one round's visits
        for chart in category.chart:
            matched = [t for t in scalars if any(re.match(rx, t) for rx in chart.multiline.tag)]
            assert len({parse_tag(t)[2].round for t in matched if t.startswith("visits/")}) <= 1, chart.title
    training = {
        c.title: sorted(t for t in scalars if any(re.match(rx, t) for rx in c.multiline.tag))
        for c in categories["training"].chart
    }
    # The update-size chart held every per-round output change too (its regex matched them as prefixes).
    assert training["update size (output change of the step)"] == ["update/logit_change", "update/output_change"]
    assert "update size per round" not in training  # one line per round, unlabelled: an image instead
    images = acc.Images("update/per_round/output_change")
    assert [e.step for e in images] == [0, 2, 4] and all(e.encoded_image_string.startswith(b"\x89PNG") for e in images)
    assert training["output logits: mean log Z"] == ["output/log_z"]


def test_depth_profile_plots_each_quantity_against_the_visit_index(fitted):
    """The depth profile: small images (one per view, ``depth/<view>``) at every logging step; their lines
    are the logged per-visit values in forward order (x = 1 … 2·K·R; attention quantities at the
    attention visits only), drawn at 360 × 240 px for TensorBoard's ~270 px card."""
    _, _, _, acc = fitted
    assert sorted(acc.Tags()["images"]) == sorted(
        [f"depth/{view}" for view in VIEWS] + ["update/per_round/output_change"]
    )
    for view in VIEWS:
        images = acc.Images(f"depth/{view}")
        assert [e.step for e in images] == [0, 2, 4]
        assert all(e.encoded_image_string.startswith(b"\x89PNG") and (e.width, e.height) == (360, 240) for e in images)

    visits = visit_order(K, R)
    assert [v.tag for v in visits[:5]] == ["r01_k1_attn", "r01_k1_ffn", "r01_k2_attn", "r01_k2_ffn", "r02_k1_attn"]
    logged = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"] if tag.startswith("visits/")}
    profile = depth_profile(logged, visits)
    for view, (_, quantities, log) in VIEWS.items():
        fig = view_figure(view, profile, visits)
        (ax,) = fig.axes
        assert ax.get_yscale() == ("log" if log else "linear")
        lines = {line.get_label(): line for line in ax.lines}
        for q in quantities:
            line = lines[LABELS[q]]
            at = [i for i, v in enumerate(visits, start=1) if q not in ATTN_QUANTITIES or v.sublayer == "attn"]
            assert list(line.get_xdata()) == at
            assert list(line.get_ydata()) == pytest.approx([logged[f"visits/{q}/{visits[i - 1].tag}"] for i in at])


def test_the_depth_images_keep_one_y_axis_across_the_steps(fitted):
    """Each view's y-axis covers every value logged at every step drawn so far, so that TensorBoard's step
    slider moves the lines, not the axis: the callback's kept range (also in its checkpoint state) holds
    all three logging steps' values, and a view drawn with it keeps that range."""
    _, _, diagnostics, acc = fitted
    visits = visit_order(K, R)
    tags = [t for t in acc.Tags()["scalars"] if t.startswith("visits/")]
    by_step = {}
    for tag in tags:
        for e in acc.Scalars(tag):
            by_step.setdefault(e.step, {})[tag] = e.value
    assert sorted(by_step) == [0, 2, 4]
    state = diagnostics.state_dict()
    assert all(type(v) is float for lim in state["profile_ylims"].values() for v in lim)  # weights_only loads it
    ylims = {view: tuple(lim) for view, lim in state["profile_ylims"].items()}
    assert sorted(ylims) == sorted([*VIEWS, "update/per_round/output_change"])
    for view, (_, quantities, log) in VIEWS.items():
        values = [
            v
            for scalars in by_step.values()
            for q in quantities
            for t, v in scalars.items()
            if t.startswith(f"visits/{q}/") and (v > 0 or not log)
        ]
        lo, hi = ylims[view]
        assert lo <= min(values) and max(values) <= hi, view
        for step in by_step:  # any step drawn with the run's range gets exactly that range
            kept = dict(ylims)
            (ax,) = view_figure(view, depth_profile(by_step[step], visits), visits, kept).axes
            assert ax.get_ylim() == pytest.approx((lo, hi)) and kept[view] == pytest.approx((lo, hi))


def test_a_later_step_out_of_range_widens_the_axis_and_it_never_shrinks():
    visits = visit_order(1, 2)
    low = {f"visits/resid_norm/{v.tag}": 1.0 + i for i, v in enumerate(visits)}  # 1 .. 4
    high = {tag: 100.0 * v for tag, v in low.items()}  # 100 .. 400
    ylims: dict = {}
    first = view_figure("norms", depth_profile(low, visits), visits, ylims).axes[0].get_ylim()
    assert first[0] <= 1.0 and 4.0 <= first[1] < 100.0
    wide = view_figure("norms", depth_profile(high, visits), visits, ylims).axes[0].get_ylim()
    assert wide[0] == pytest.approx(first[0]) and wide[1] >= 400.0
    again = view_figure("norms", depth_profile(low, visits), visits, ylims).axes[0].get_ylim()
    assert again == pytest.approx(wide)


def test_the_depth_profile_is_the_first_group_tensorboard_opens(fitted):
    """TensorBoard opened on `epoch`. Its TIME SERIES dashboard (the default) sorts every tag
    (scalars, images, histograms) by name, groups them by the part before the first '/', and opens the
    first two groups (TensorBoard 2.21's webfiles, `zD` and the `tagGroupExpanded` default). With the
    images under `depth/` the depth profile opens first, then Lightning's `epoch`."""
    _, _, _, acc = fitted
    tags = [t for kind in ("scalars", "images", "histograms") for t in acc.Tags()[kind]]
    assert "epoch" in tags  # Lightning logs it
    # TensorBoard compares digits numerically and puts them and '/' first; no tag here has either
    # before the group's end, so the groups' order is the plain string order.
    groups = sorted({t.split("/", 1)[0] for t in tags})
    assert groups[:2] == ["depth", "epoch"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_tensorboard_server_lists_the_tags(fitted):
    t, _, _, _ = fitted
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(t.logger.save_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
            "--reload_interval",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base, expected = f"http://127.0.0.1:{port}", set(expected_scalar_tags(K, R))
    try:
        seen = set()

        def served() -> bool:  # waited on while TensorBoard works (tests.helpers.wait_until), no time guess
            try:
                seen.update(tag for tags in _get(f"{base}/data/plugin/scalars/tags").values() for tag in tags)
            except OSError:
                pass
            return expected <= seen

        try:
            wait_until(served, proc, "it served the tags", poll=1.0)
        except AssertionError as err:
            raise AssertionError(f"{err}; missing {sorted(expected - seen)[:10]}") from None
        hists = {tag for tags in _get(f"{base}/data/plugin/histograms/tags").values() for tag in tags}
        assert "hist/state/r03" in hists
        layout = _get(f"{base}/data/plugin/custom_scalars/layout")
        titles = {c["title"] for c in layout["category"]}
        assert {"sublayers", "training", "round 01", "round 02", "round 03"} <= titles and "visits" not in titles
        images = {tag for tags in _get(f"{base}/data/plugin/images/tags").values() for tag in tags}
        assert "depth/norms" in images
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_off_and_bad_arguments(tmp_path):
    module = tiny_module()
    t = trainer(tmp_path, [VisitDiagnostics(every_n_steps=0)], max_steps=2, limit_val_batches=0)
    t.fit(module, random_tokens(8))
    acc = EventAccumulator(t.log_dir)
    acc.Reload()
    assert not [tag for tag in acc.Tags()["scalars"] if tag.startswith(("visits/", "sublayers/", "grad/"))]
    with pytest.raises(ValueError, match="every_n_steps must be >= 0"):
        VisitDiagnostics(every_n_steps=-1)


def test_gradient_accumulation(tmp_path):
    module = tiny_module()
    diagnostics = VisitDiagnostics(every_n_steps=1, histograms=False)
    t = trainer(tmp_path, [diagnostics], max_steps=2, accumulate_grad_batches=2, limit_val_batches=0)
    t.fit(module, random_tokens(16))
    # Step 0: two micro-batches, each loss scaled by ½ (as Lightning does), per-visit gradients summed.
    acc = EventAccumulator(t.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    grads, others = visit_gradients(tiny_module().model, list(random_tokens(16))[:2], scale=0.5)
    for tag, value in expected_values(grads, others).items():
        assert acc.Scalars(tag)[0].step == 0 and acc.Scalars(tag)[0].value == pytest.approx(value, rel=1e-4), tag
    stats = diagnostics.last_stats
    assert stats["step"] == 1 and len(stats["visits"]) == 2 * K * R
    assert all(0 < v <= R + 1e-4 for v in stats["kappa"].values())
    assert all(torch.isfinite(torch.tensor(q)).all() for s in stats["visits"].values() for q in s.values())


def test_the_last_step_is_measured(tmp_path):
    """A 100-step run measured steps 0 and 50 only, so the summary's end-of-training
    statistics were 50 steps stale."""
    module, diagnostics = tiny_module(SpyLM), VisitDiagnostics(every_n_steps=3, histograms=False, update_size=False)
    trainer(tmp_path, [diagnostics], max_steps=5).fit(module, random_tokens())
    assert [s for s, on in module.attached_at.items() if on] == [0, 3, 4]
    assert diagnostics.last_stats["step"] == 4


def test_depth_profile_is_drawn_off_the_main_thread_and_its_errors_come_back(tmp_path, monkeypatch):
    """The profile is drawn on a thread of its own, whose malloc arena is its own: drawn on the main thread,
    matplotlib fragmented the heap that HostMemory keeps (+0.4-0.9 GB peak RSS in a 60-step `make fit` run).
    An error there reaches the fit as before: without matplotlib, one warning and the profile off."""
    import threading

    from loopnet.diagnostics import profile

    drawn_on = []

    def no_matplotlib(*args, **kwargs):
        drawn_on.append(threading.current_thread())
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(profile, "profile_pngs", no_matplotlib)
    diagnostics = VisitDiagnostics(every_n_steps=2, histograms=False, update_size=False)
    with pytest.warns(UserWarning, match="no depth profile"):
        trainer(tmp_path, [diagnostics], max_steps=5).fit(tiny_module(), random_tokens())
    assert len(drawn_on) == 1 and drawn_on[0] is not threading.main_thread()
    assert diagnostics.profile is False and diagnostics.last_stats["step"] == 4


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"every_n_steps": -1}, "diagnostics.every_n_steps must be >= 0 (0 turns it off), got -1"),
        ({"hist_samples": 0}, "diagnostics.hist_samples must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(kwargs, message):
    with pytest.raises(ValueError) as err:
        VisitDiagnostics(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("kwargs", [{"every_n_steps": 0}, {"hist_samples": 1}])
def test_the_edge_values_are_accepted(kwargs):
    diagnostics = VisitDiagnostics(**kwargs)
    assert all(getattr(diagnostics, k) == v for k, v in kwargs.items())
