"""`loopnet probe --groups`: one step's output change split by parameter group, under AdamW, SGD and Muon.

The update-size bound of DeepNet/DeepLoop, M·κ·(β/α)², covers the β-scaled matrices only (V, O, fc1,
fc2 = `BETA_SCALED`). A model's output also moves with its embeddings and tied head, its Norm gains
(≈ lr per visit under a sign-like step, whatever α and β), and Q/K. Each is measured on its own:

    1. from the starting weights θ (a fresh model, or a checkpoint of a real run), one step of the
       optimiser on one batch gives the full update Δ = θ' − θ (AdamW: decoupled weight decay
       included; SGD: −η·g, no clipping, no momentum; Muon: torch.optim.Muon on the blocks' matrices and
       AdamW on the rest, both at η, `LoopedLM.configure_optimizers` with optimizer "muon");
    2. for every group g, the model is set to θ + Δ⊙1_g (that group's update only, every other
       group's zeroed) and the relative change of the final state ‖x'_R − x_R‖/‖x_R‖ on the same batch
       is measured (`loopnet.diagnostics.update_size`, no grad, eval mode); "all" is θ + Δ;
    3. first-order check: the groups' state changes, as vectors, add up to the full step's up to
       second-order terms: ‖δ_all − Σ_g δ_g‖ / ‖δ_all‖ is reported (O(η): it halves with η).

The theory's DeepNorm/DeepLoop ratio of the β-scaled matrices' change at equal learning rate and N = K·R:
(β/α)² ratio = 4N under SGD (a step ∝ the gradient), M·β/α ratio = 2√N under a sign update (AdamW's
first step is lr·sign(g) up to ε) and under Muon (its step, an orthogonalised matrix of fixed spectral
size, does not scale with the gradient either).

Groups: `embed+head` (token and position embeddings; the head, tied or not), `norm` (every Norm's
gain and bias), `VOfc` (V, O, fc1, fc2 with their biases: the β-scaled set), `QK` (Q and K, the rows of
the fused QKV projection). Every parameter element belongs to exactly one group.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a function needs it (a light module)
    import torch

GROUPS = ("embed+head", "norm", "VOfc", "QK")
GROUP_TEXT = {"embed+head": "embeddings + head", "norm": "norm gains", "VOfc": "V/O/fc1/fc2 (β-scaled)", "QK": "Q/K"}
OPTIMIZERS = ("adamw", "sgd", "muon")
OPTIMIZER_TEXT = {"adamw": "AdamW", "sgd": "SGD", "muon": "Muon (+ AdamW on the rest)"}


def group_masks(model) -> dict[str, dict[str, torch.Tensor]]:
    """Group -> {parameter name: 0/1 mask of its elements in the group} (names of `named_parameters`,
    so a tied head is the embedding). Masks of one parameter over the groups sum to one."""
    import itertools

    import torch
    from torch import nn

    from loopnet.model.layers import QKVLinear
    from loopnet.model.scales import BETA_SCALED

    masks: dict[str, dict[str, torch.Tensor]] = {g: {} for g in GROUPS}
    owner = {}
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            owner[f"{mname}.{pname}" if mname else pname] = (mname.rsplit(".", 1)[-1], module, pname)
    for name, p in model.named_parameters():
        leaf, module, pname = owner[name]
        ones = torch.ones_like(p)
        if isinstance(module, (nn.Embedding,)) or leaf == "lm_head":
            masks["embed+head"][name] = ones
        elif isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
            masks["norm"][name] = ones
        elif isinstance(module, QKVLinear):  # rows [W_Q; W_K; W_V]: V is β-scaled, Q and K are not
            starts = [0, *itertools.accumulate(module.sizes)]
            for i, part in enumerate(QKVLinear.PARTS):
                m = torch.zeros_like(p)
                m[starts[i] : starts[i + 1]] = 1
                group = "VOfc" if part in BETA_SCALED else "QK"
                masks[group][name] = masks[group].get(name, torch.zeros_like(p)) + m
        elif leaf in BETA_SCALED:
            masks["VOfc"][name] = ones
        elif pname == "qk_bias":  # a bias of W_Q and W_K
            masks["QK"][name] = ones
        else:
            raise ValueError(f"parameter {name} belongs to no update group; add it to update_groups.group_masks")
    return masks


def optimizer_for(kind: str, lm, lr: float):
    """The step's optimiser: the run's own AdamW (`LoopedLM.configure_optimizers`' groups and weight
    decay) at a constant `lr`, Muon with AdamW (the same, with optimizer "muon"; every group at `lr`),
    or plain SGD at `lr`."""
    import torch

    if kind == "sgd":
        return torch.optim.SGD(lm.model.parameters(), lr=lr)
    own = lm.optim
    lm.optim = replace(own, optimizer="muon" if kind == "muon" else "adamw")
    try:
        opt = lm.configure_optimizers()["optimizer"]
    finally:
        lm.optim = own
    for group in opt.param_groups:
        group["lr"] = lr
    return opt


def measure_groups(lm, batch, kind: str, lr: float, clip=None, optimizer_state: dict | None = None) -> dict:
    """One `kind` step of `lm` (a LoopedLM) on `batch` from its current weights, split by group (see the
    module docstring). Returns {group or "all": relative change of the final state}, the logits' change
    under "all_logits", the first-order residual under "additivity", κ̂ and the batch loss. The model's
    weights are left as they were (θ)."""
    import torch

    from loopnet.diagnostics.callback import physical_sublayers
    from loopnet.diagnostics.visit_probe import VisitProbe, kappas
    from loopnet.diagnostics.update_size import round_outputs

    model = lm.model
    inputs, targets = batch
    opt = optimizer_for(kind, lm, lr)
    if optimizer_state is not None and kind != "sgd" and (kind == "muon") == ("muon" in optimizer_state):
        opt.load_state_dict(optimizer_state)  # the run's moments (of the same optimiser): the update it would take next
        for group in opt.param_groups:
            group["lr"] = lr
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    before = round_outputs(model, inputs)
    probe = VisitProbe()
    model.attach_observer(probe)
    model.train()
    _, loss = model(inputs, targets)
    loss.backward()
    model.attach_observer(None)
    num, den = probe.alignment_terms(physical_sublayers(model))
    kappa = kappas(num, den)["model"].item()
    if clip and kind == "adamw":
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    delta = {n: p.detach() - theta[n] for n, p in model.named_parameters()}
    params = dict(model.named_parameters())
    masks = group_masks(model)

    def state_change(mask: dict | None):
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(theta[n] + (delta[n] if mask is None else delta[n] * mask.get(n, 0.0)))
        after = round_outputs(model, inputs)
        return after[-2] - before[-2], after[-1] - before[-1]

    base = torch.linalg.vector_norm(before[-2].float())
    out = {}
    total = None
    for g in GROUPS:
        d, _ = state_change(masks[g])
        out[g] = (torch.linalg.vector_norm(d.float()) / base).item()
        total = d if total is None else total + d
    d_all, d_logits = state_change(None)
    out["all"] = (torch.linalg.vector_norm(d_all.float()) / base).item()
    out["all_logits"] = (
        torch.linalg.vector_norm(d_logits.float()) / torch.linalg.vector_norm(before[-1].float())
    ).item()
    out["additivity"] = (
        torch.linalg.vector_norm((d_all - total).float()) / torch.linalg.vector_norm(d_all.float()).clamp_min(1e-30)
    ).item()
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(theta[n])
    return {**out, "kappa": kappa, "loss": loss.item()}


def fresh_model(base, optim, scheme: str, rounds: int, seed: int):
    """A LoopedLM at initialisation: the config's model with `scheme` and R, seeded (as `probe` does)."""
    import torch

    from loopnet.model.scales import parse_scheme
    from loopnet.training.module import LoopedLM

    residual, p = parse_scheme(scheme)
    torch.manual_seed(seed)
    cfg = replace(base, residual=residual, p=p, n_rounds=rounds, dropout=0.0)
    return LoopedLM(config=cfg, optim=replace(optim, warmup_steps=0, decay_steps=10**9))


def label(scheme: str, config) -> str:
    """A starting point's name in the tables: the scheme, marked when its Norms have no gains."""
    return scheme + ("" if config.norm_affine else "-nogain")


def read_checkpoint(path: str) -> dict:
    """A checkpoint of `loopnet fit`, read as `loopnet fit/test/eval` read one (`loopnet.checkpoints`: a
    missing, empty, corrupt or code-carrying file is refused in one line), its tensors left on disk."""
    from loopnet.checkpoints import check_checkpoint_file, is_sharded_checkpoint, load_checkpoint_meta

    check_checkpoint_file(path, "--checkpoints")
    if is_sharded_checkpoint(path):
        raise ValueError(
            f"--checkpoints {path} is a sharded (FSDP) checkpoint folder; fix: consolidate it into one "
            f"file first: python -m lightning.pytorch.utilities.consolidate_checkpoint {path}"
        )
    ckpt = load_checkpoint_meta(path)
    hp = ckpt.get("hyper_parameters")
    if not isinstance(hp, dict) or not isinstance(hp.get("config"), dict) or not isinstance(hp.get("optim"), dict):
        raise ValueError(
            f"{path} is not a loopnet checkpoint (no hyper_parameters.config and .optim); fix: give a "
            "checkpoint that loopnet fit wrote"
        )
    return ckpt


def from_checkpoint(path: str):
    """(LoopedLM with a checkpoint's weights, its AdamW state or None, its step, its label)."""
    from loopnet.model import LoopConfig
    from loopnet.model.scales import scheme_label
    from loopnet.training.module import LoopedLM, OptimConfig

    ckpt = read_checkpoint(path)
    hp = ckpt["hyper_parameters"]
    config = LoopConfig(**{**hp["config"], "dropout": 0.0})
    optim = OptimConfig(**{k: tuple(v) if k == "betas" else v for k, v in hp["optim"].items()})
    lm = LoopedLM(config=config, optim=replace(optim, warmup_steps=0, decay_steps=10**9))
    lm.load_state_dict(ckpt["state_dict"])
    states = ckpt.get("optimizer_states") or [None]
    return lm, states[0], int(ckpt.get("global_step", 0)), label(scheme_label(config.residual, config.p), config)


# ---------------------------------------------------------------------------------------- summary
def theory_ratio(kind: str, n: int) -> float:
    """DeepNorm/DeepLoop ratio of the β-scaled matrices' output change at unrolled depth N: (β/α)²'s
    ratio 4N under SGD, (β/α)'s ratio 2√N under a step whose size does not follow the gradient's (AdamW's
    sign-like first step, Muon's orthogonalised one)."""
    return 4 * n if kind == "sgd" else 2 * math.sqrt(n)


def summarise(rows: list[dict]) -> dict:
    """(label, R, optimizer) -> {quantity: (mean, std, n)} over seeds (or the one checkpoint)."""
    keys = (*GROUPS, "all", "all_logits", "additivity", "kappa")
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault((row["label"], row["rounds"], row["optimizer"]), []).append(row)
    out = {}
    for key, rs in cells.items():
        out[key] = {
            k: (statistics.fmean(r[k] for r in rs), statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0, len(rs))
            for k in keys
        }
        out[key]["n_blocks"] = rs[0]["n_blocks"]
    return out


def ratio_rows(summary: dict) -> list[dict]:
    """DeepNorm/DeepLoop ratios per group, at every (R, optimizer, suffix) where both were probed:
    labels `deepnorm<suffix>` and `deeploop<suffix>` (a checkpoint's suffix is `@step<S>`)."""
    out = []
    for (label, rounds, kind), dn in summary.items():
        if not label.startswith("deepnorm"):
            continue
        suffix = label.removeprefix("deepnorm")
        dl = summary.get(("deeploop" + suffix, rounds, kind))
        if dl is None:
            continue
        n = dn["n_blocks"] * rounds
        ratios = {g: (dn[g][0] / dl[g][0] if dl[g][0] > 0 else math.nan) for g in (*GROUPS, "all")}
        out.append(
            {"suffix": suffix, "rounds": rounds, "optimizer": kind, "N": n, "theory": theory_ratio(kind, n), **ratios}
        )
    return sorted(out, key=lambda r: (r["optimizer"], r["suffix"], r["rounds"]))


def where(suffix: str) -> str:
    """A ratio row's starting point from its label suffix: ``init``, ``step100``, ``nogain init``."""
    variant, _, step = suffix.partition("@")
    return " ".join(p for p in (variant.lstrip("-"), step or "init") if p)


def markdown(rows: list[dict], meta: dict) -> str:
    summary = summarise(rows)
    lines = [f"# {meta['title']}", ""]
    if meta.get("notes"):
        lines += [meta["notes"].strip(), ""]
    lines += [
        "## How this was produced",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"- {meta['what']}; one step per optimiser on the first training batch; AdamW at lr {meta['lr']:g} "
        f"(the run's weight decay, gradient clipping {meta['clip']}), SGD at lr {meta['sgd_lr']:g} (no "
        "momentum, no clipping)",
        f"- machine: {meta['machine']}; {meta['seconds']:.0f} s in all; loopnet @ {meta['commit']}",
        "- **method**: the step's full update Δ is computed once; for each parameter group only that "
        "group's update is applied (every other group's update zeroed) and the relative change of the final "
        "state ‖x'_R − x_R‖/‖x_R‖ on the same batch is measured; *all* applies the whole step. *additivity*: "
        "‖δ_all − Σ_g δ_g‖/‖δ_all‖ of the state changes as vectors, the first-order expansion's residual "
        "(0 for a linear response).",
        "- groups: " + "; ".join(f"**{g}** = {t}" for g, t in GROUP_TEXT.items()),
        "",
    ]
    for kind in dict.fromkeys(r["optimizer"] for r in rows):
        lines += [
            f"## {OPTIMIZER_TEXT[kind]}: output change per group",
            "",
            "| scheme | R | " + " | ".join(GROUP_TEXT[g] for g in GROUPS) + " | all | additivity | κ̂ |",
            "|---|---:|" + "---:|" * (len(GROUPS) + 3),
        ]
        for (label, rounds, k), s in summary.items():
            if k != kind:
                continue
            cell = lambda q, d=3: f"{s[q][0]:.{d}g}" + (f" ± {s[q][1]:.2g}" if s[q][2] > 1 else "")  # noqa: E731
            lines.append(
                f"| {label} | {rounds} | "
                + " | ".join(cell(g) for g in GROUPS)
                + f" | {cell('all')} | {cell('additivity', 2)} | {s['kappa'][0]:.2f} |"
            )
        lines.append("")
    ratios = ratio_rows(summary)
    if ratios:
        lines += [
            "## DeepNorm / DeepLoop, per group, against the theory",
            "",
            "Ratio of the mean output changes at equal learning rate. Theory for the β-scaled matrices: "
            "4N under SGD ((β/α)² ratio), 2√N under a sign-like step (AdamW's first step; (β/α) ratio).",
            "",
            "| optimiser | at | R | N | theory | " + " | ".join(GROUP_TEXT[g] for g in GROUPS) + " | all |",
            "|---|---|---:|---:|---:|" + "---:|" * (len(GROUPS) + 1),
        ]
        for r in ratios:
            theory = f"{r['theory']:.1f} ({'4N' if r['optimizer'] == 'sgd' else '2√N'})"
            lines.append(
                f"| {r['optimizer']} | {where(r['suffix'])} | {r['rounds']} | {r['N']} | "
                f"{theory} | " + " | ".join(f"{r[g]:.3g}" for g in (*GROUPS, "all")) + " |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"
