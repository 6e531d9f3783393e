"""The one place for the width and depth rules of hyperparameter transfer (`LoopConfig.parametrization`).

With m_d = d / d₀ the width multiplier (d₀ = `mup_base_width`) and, for CompleteP, m_L = N / N₀ the depth
multiplier (N = P + K·R + C at the training R, N₀ = `completep_base_depth`) and exponent a = `completep_alpha`:

    quantity                        standard     mup (Yang et al. 2022)      completep (Dey et al. 2025)
    hidden matrices' init std       σ            σ/√m_d  (∝ 1/√fan_in)       σ/√m_d
    hidden matrices' Adam lr        η            η/m_d                       η·m_L^(a−1)/m_d
    hidden matrices' weight decay   λ            λ·m_d   (lr·λ unchanged)    λ·m_d
    blocks' norm gains, biases lr   η            η                           η·m_L^(a−1)
    embeddings, final Norm, head    η, λ         η, λ                        η, λ
    output logit multiplier         1            1/m_d                       1/m_d
    attention logits                q·k/√d_h     q·k·√d_h₀/d_h (∝ 1/d_h)     q·k·√d_h₀/d_h
    Pre-LN branch multiplier ε      branch_scale branch_scale                m_L^(−a)
    AdamW ε                         ε            ε                           ε·m_d^(−1)·m_L^(−a)

Hidden matrices are the blocks' linear weights (QKV, O, fc1, fc2, in the prelude, the loop and the coda)
and the linear injection's; σ is `init_std` (init "normal"), while xavier's std √(2/(fan_in+fan_out)) is
already ∝ 1/√width and stays. Every rule is 1 at the base width and depth: a μP model at d = d₀ is the
standard one, so a rate tuned there is the standard model's. The head dimension d_h grows with d at a
fixed head count (d_h₀ = d₀ / n_heads): √d_h₀/d_h is 1/√d_h at d₀. The logit multiplier and the attention
factor are applied as fixed scales (the final Norm's output, the queries), so every path that reads the
head or the attention (training, the cache, generation, the probes) sees them.
"""

from __future__ import annotations

from typing import Any

# A LoopConfig: config.py imports this module, so the type is named here, not imported (no import circle).
Config = Any

PARAMETRIZATIONS = ("standard", "mup", "completep")


def width_multiplier(cfg: Config) -> float:
    """m_d = d / d₀ (1 under the standard parametrization)."""
    return 1.0 if cfg.parametrization == "standard" else cfg.d_model / cfg.mup_base_width


def depth_multiplier(cfg: Config) -> float:
    """m_L = N / N₀ at the training depth N = P + K·R + C (1 unless CompleteP)."""
    return cfg.n_unrolled / cfg.completep_base_depth if cfg.parametrization == "completep" else 1.0


def hidden_init_gain(cfg: Config) -> float:
    """Factor on the hidden matrices' normal init std σ: 1/√m_d (xavier is ∝ 1/√fan already: 1)."""
    return 1.0 if cfg.init_scheme == "xavier" else width_multiplier(cfg) ** -0.5


def logit_multiplier(cfg: Config) -> float:
    """The output logits' multiplier d₀/d (μP's readout: logits = (d₀/d)·W·Norm(x))."""
    return 1.0 / width_multiplier(cfg)


def query_scale(cfg: Config) -> float:
    """Factor on the queries so that attention's logits are q·k·√d_h₀/d_h instead of q·k/√d_h: √(d₀/d)."""
    return width_multiplier(cfg) ** -0.5


def completep_epsilon(cfg: Config) -> float:
    """CompleteP's Pre-LN branch multiplier m_L^(−a) (a = 1; a = ½ is depth-μP)."""
    return depth_multiplier(cfg) ** -cfg.completep_alpha


def group_rules(cfg: Config) -> dict[str, dict[str, float]]:
    """Per parameter role, the factors on AdamW's lr, weight decay and ε (see the table above):
    "hidden" (the hidden matrices), "block_vector" (the blocks' norm gains and biases), "other"
    (embeddings, an untied head, the final Norm, a diagonal injection's vectors)."""
    m_d, m_L = width_multiplier(cfg), depth_multiplier(cfg)
    depth_lr = m_L ** (cfg.completep_alpha - 1) if cfg.parametrization == "completep" else 1.0
    eps = 1.0 / (m_d * m_L**cfg.completep_alpha) if cfg.parametrization == "completep" else 1.0
    return {
        "hidden": {"lr": depth_lr / m_d, "weight_decay": m_d, "eps": eps},
        "block_vector": {"lr": depth_lr, "weight_decay": 1.0, "eps": eps},
        "other": {"lr": 1.0, "weight_decay": 1.0, "eps": eps},
    }


def check_parametrization(cfg: Config) -> None:
    """Refuse a parametrization's incompatible settings, in one line each."""
    p = cfg.parametrization
    if p == "standard":
        if cfg.mup_base_width is not None or cfg.completep_base_depth is not None:
            raise ValueError(
                "LoopConfig.mup_base_width and completep_base_depth belong to parametrization mup or "
                "completep; fix: remove them, or set model.config.parametrization: mup"
            )
        return
    if cfg.mup_base_width is None or cfg.mup_base_width < 1:
        raise ValueError(
            f"LoopConfig.parametrization={p!r} needs mup_base_width >= 1, the width whose rates are "
            f"tuned; fix: set model.config.mup_base_width, e.g. 64"
        )
    if cfg.mup_base_width % cfg.n_heads:
        raise ValueError(
            f"LoopConfig.mup_base_width={cfg.mup_base_width} is not divisible by n_heads={cfg.n_heads} "
            f"(μP scales d_h at a fixed head count); fix: pick a base width that n_heads divides"
        )
    if p == "mup":
        if cfg.completep_base_depth is not None:
            raise ValueError(
                "LoopConfig.completep_base_depth belongs to parametrization completep; fix: remove it "
                "or set model.config.parametrization: completep"
            )
        return
    if cfg.completep_base_depth is None or cfg.completep_base_depth < 1:
        raise ValueError(
            "LoopConfig.parametrization='completep' needs completep_base_depth >= 1, the depth N₀ = "
            "P + K·R + C whose rates are tuned; fix: set model.config.completep_base_depth, e.g. 4"
        )
    if not 0.5 <= cfg.completep_alpha <= 1.0:
        raise ValueError(
            f"LoopConfig.completep_alpha={cfg.completep_alpha} must be in [0.5, 1] (1: CompleteP, "
            f"0.5: depth-μP); fix: give 1.0"
        )
    if cfg.residual != "preln" or cfg.branch_scale != "one":
        raise ValueError(
            f"LoopConfig.parametrization='completep' scales the Pre-LN branch by (N/N₀)^-a itself "
            f"(residual={cfg.residual!r}, branch_scale={cfg.branch_scale!r}); fix: set "
            f"model.config.residual: preln and branch_scale: one"
        )
    if cfg.scales_depth == "sampled":
        raise ValueError(
            "LoopConfig.parametrization='completep' keeps its multipliers and rates at the mean depth "
            "N = P + K·n_rounds + C; fix: set model.config.scales_depth: mean"
        )


def describe(cfg: Config) -> str:
    """One line of the rules' values, for logs and reports."""
    rules = group_rules(cfg)
    return (
        f"{cfg.parametrization}: m_d {width_multiplier(cfg):g}, m_L {depth_multiplier(cfg):g}, hidden lr ×"
        f"{rules['hidden']['lr']:.4g}, logits ×{logit_multiplier(cfg):.4g}, queries ×{query_scale(cfg):.4g}, "
        f"ε {cfg.branch_epsilon:.4g}"
    )


def check_optimizer(parametrization: str, optimizer: str) -> None:
    """μP's per-group rates are AdamW's: refuse Muon under mup and completep, in one line."""
    if parametrization != "standard" and optimizer != "adamw":
        raise ValueError(
            f"model.config.parametrization={parametrization!r} sets AdamW's per-group rates and "
            f"model.optim.optimizer={optimizer!r} is not AdamW; fix: set model.optim.optimizer: adamw, "
            f"or parametrization: standard"
        )
