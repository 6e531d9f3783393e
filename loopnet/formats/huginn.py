"""Huginn-0125 (seal-rg/recurrent-pretraining's `raven` files, `model_type huginn_raven`) read into a
`LoopConfig` and a loopnet state dict.

Huginn's architecture in loopnet's options: a Post-LN sandwich block (`residual: postln`, `sandwich`:
x ← norm_2(attn(norm_1 x) + x), x ← norm_4(mlp(norm_3 x) + x)), a SwiGLU MLP of width
`intermediate_size`, RoPE of base `rope_base`, `qk_bias`, the embedding times √d (`embed_scale`),
prelude / core / coda, the linear adapter W·concat[state, prelude output] (`injection: linear`) from a
random state (`state_init: random`), and ln_f applied after the loop and again after the coda
(`loop_norm`). Its names map one to one onto loopnet's:

    transformer.wte / ln_f / adapter         wte / final_norm / injection.adapter
    transformer.prelude.i, core_block.i, coda.i      prelude.i, blocks.i, coda.i, each with
        norm_1, norm_2 (the attention's)     attn.inner_norm, attn.norm
        norm_3, norm_4 (the MLP's)           ffn.inner_norm, ffn.norm
        attn.Wqkv, attn.qk_bias, attn.proj   attn.f.qkv_proj, attn.f.qk_bias, attn.f.o_proj
        mlp.fc, mlp.proj                     ffn.f.fc1, ffn.f.fc2
    lm_head                                  lm_head (tied to wte unless tie_embeddings is false)
    freqs_cis (the RoPE table, a buffer)     checked against loopnet's own table of rope_base

Huginn's rotary embedding rotates the interleaved pairs (2i, 2i+1) of a head; loopnet's rotates
(i, i + d_h/2). Permuting each head's query and key rows (and their qk_bias) into the second order
gives the same attention logits, since q·k is unchanged when q and k are permuted alike."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from loopnet.formats.source import (
    ImportFormatError,
    check_keys,
    check_shapes,
    expected_keys,
    read_json,
    read_weights,
)
from loopnet.model.config import LoopConfig

MODEL_TYPE = "huginn_raven"
# What loopnet computes as Huginn-0125 does; a config naming anything else is refused, not approximated.
REQUIRED = {
    "block_class_name": "SandwichBlock",
    "mlp_class_name": "GatedMLP",
    "nonlin_name": "SiLU",
    "norm_class_name": "RMSNorm_llama",
    "injection_type": "linear",
    "bias": False,
}
BLOCK_NAMES = {
    "norm_1.weight": "attn.inner_norm.weight",
    "norm_2.weight": "attn.norm.weight",
    "norm_3.weight": "ffn.inner_norm.weight",
    "norm_4.weight": "ffn.norm.weight",
    "attn.Wqkv.weight": "attn.f.qkv_proj.weight",
    "attn.qk_bias": "attn.f.qk_bias",
    "attn.proj.weight": "attn.f.o_proj.weight",
    "mlp.fc.weight": "ffn.f.fc1.weight",
    "mlp.proj.weight": "ffn.f.fc2.weight",
}
PARTS = {"prelude": "prelude", "core_block": "blocks", "coda": "coda"}


def is_huginn(folder: Path) -> bool:
    path = Path(folder) / "config.json"
    return path.is_file() and read_json(Path(folder), "config.json").get("model_type") == MODEL_TYPE


def huginn_config(hf: dict, source: str = "config.json") -> LoopConfig:
    """The `LoopConfig` of a Huginn config.json (a dict). Inference settings follow Huginn's: R = its
    `mean_recurrence`; training ones too: Huginn's round draw with its mean backprop depth."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ImportFormatError(
            f"{source}: model_type is {hf.get('model_type')!r}, not {MODEL_TYPE!r}; fix: give a "
            f"Huginn folder (tomg-group-umd/huginn-0125) or the importer of its format"
        )
    for key, value in REQUIRED.items():
        if key in hf and hf[key] != value:
            raise ImportFormatError(
                f"{source}: {key}={hf[key]!r}, but loopnet reads Huginn with {key}={value!r} only; "
                f"fix: give a checkpoint of the released architecture"
            )
    d = hf["n_embd"]
    heads = hf.get("n_heads", hf.get("num_attention_heads"))
    if hf.get("num_key_value_heads", heads) != heads:
        raise ImportFormatError(
            f"{source}: num_key_value_heads={hf['num_key_value_heads']} differs from "
            f"n_heads={heads} "
            f"(grouped-query attention), which loopnet does not have; fix: give a checkpoint "
            f"without GQA"
        )
    mean = hf.get("mean_recurrence", 32)
    return LoopConfig(
        vocab_size=hf.get("padded_vocab_size", hf["vocab_size"]),
        seq_len=hf["block_size"],
        d_model=d,
        n_heads=heads,
        n_blocks=hf["n_layers_in_recurrent_block"],
        n_rounds=mean,
        n_prelude=hf["n_layers_in_prelude"],
        n_coda=hf["n_layers_in_coda"],
        mlp="swiglu",
        ffn_width=hf["intermediate_size"],
        bias=False,
        tie_embeddings=hf.get("tie_embeddings", True),
        positions="rope",
        rope_base=float(hf.get("rope_base", 50_000)),
        qk_bias=hf.get("qk_bias", True),
        norm="rmsnorm",
        residual="postln",
        sandwich=True,
        wiring="inject",
        injection="linear",
        inject_into="first",
        norm_eps=eps(hf.get("norm_eps", 1e-6), 1e-6),
        embed_scale=True,
        loop_norm=True,
        state_init="random",  # the reference draws it whatever config.json's state_init says
        init="normal",
        init_std=math.sqrt(2 / (5 * d)),  # Huginn's "std": its init and its random state's
        round_sampling="poisson_lognormal",
        backprop_rounds=min(hf.get("mean_backprop_depth", 8), mean),
    )


def eps(value: float, default: float) -> float | None:
    """`LoopConfig.norm_eps` of a source's ε: None (loopnet's default, kept out of run names) when it is the
    default."""
    return None if math.isclose(value, default) else float(value)


def interleaved_to_half(head_dim: int) -> torch.Tensor:
    """Index order that moves Huginn's rotary pairs (2i, 2i+1) to loopnet's (i, i + d_h/2)."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def _qkv(weight: torch.Tensor, cfg: LoopConfig) -> torch.Tensor:
    """Wqkv with each head's query and key rows in loopnet's rotary order (values unchanged)."""
    d, H, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
    order = interleaved_to_half(hd)
    q, k, v = weight.split(d)
    permute = lambda w: w.view(H, hd, d)[:, order].reshape(d, d)
    return torch.cat([permute(q), permute(k), v])


def _check_rope_table(source: str, table: torch.Tensor, cfg: LoopConfig) -> None:
    """Huginn's stored `freqs_cis` [1, T, 1, d_h/2, 2] (cos, sin) must be the table of rope_base."""
    from loopnet.model.layers import Rotary

    ours = Rotary(cfg.head_dim, cfg.seq_len, cfg.rope_base)
    want = torch.stack([ours.cos[0, 0], ours.sin[0, 0]], dim=-1)
    got = table.float().reshape(table.shape[1], -1, 2) if table.dim() == 5 else None
    # bf16 stores cos and sin to 2^-8 relative: a different base or pairing differs by far more.
    if got is None or got.shape != want.shape or not torch.allclose(got, want, atol=2**-7, rtol=0):
        raise ImportFormatError(
            f"{source}: freqs_cis is not the rotary table of rope_base={cfg.rope_base:g} and "
            f"block_size={cfg.seq_len}; fix: give the config.json that belongs to these weights"
        )


def huginn_state(tensors: dict[str, torch.Tensor], cfg: LoopConfig, source: str = "weights") -> dict[str, torch.Tensor]:
    """loopnet's state dict from Huginn's tensors, every tensor used and every weight filled (else one line
    naming the keys); tensors keep their dtype."""
    shapes = expected_keys(cfg)
    remaining = dict(tensors)
    state: dict[str, torch.Tensor] = {}
    order = interleaved_to_half(cfg.head_dim)
    for name in list(remaining):
        parts = name.split(".")
        if name == "freqs_cis":
            _check_rope_table(source, remaining.pop(name), cfg)
        elif name in ("transformer.wte.weight", "transformer.ln_f.weight", "transformer.adapter.weight"):
            target = {"wte": "wte.weight", "ln_f": "final_norm.weight", "adapter": "injection.adapter.weight"}
            state[target[parts[1]]] = remaining.pop(name)
        elif name == "lm_head.weight" and not cfg.tie_embeddings:
            state["lm_head.weight"] = remaining.pop(name)
        elif parts[0] == "transformer" and parts[1] in PARTS and len(parts) > 3 and ".".join(parts[3:]) in BLOCK_NAMES:
            tensor, leaf = remaining.pop(name), ".".join(parts[3:])
            if leaf == "attn.Wqkv.weight":
                tensor = _qkv(tensor, cfg)
            elif leaf == "attn.qk_bias":  # [2, 1, H, d_h] -> loopnet's [2, H, 1, d_h], pairs reordered
                tensor = tensor.transpose(1, 2)[..., order]
            state[f"{PARTS[parts[1]]}.{parts[2]}.{BLOCK_NAMES[leaf]}"] = tensor
    tied = remaining.pop("lm_head.weight", None) if cfg.tie_embeddings else None
    if tied is not None and "wte.weight" in state and not torch.equal(tied, state["wte.weight"]):
        raise ImportFormatError(
            f"{source}: lm_head.weight differs from transformer.wte.weight although "
            f"tie_embeddings is true; fix: set tie_embeddings false in config.json"
        )
    if cfg.tie_embeddings and "wte.weight" in state:
        state["lm_head.weight"] = state["wte.weight"]
    check_keys(source, set(remaining), set(shapes), set(state))
    check_shapes(source, state, shapes)
    return state


def read_huginn(folder: str | Path) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """(LoopConfig, state dict, meta) of a Huginn folder as the hub serves it (config.json, safetensors weights
    with or without their index). `meta`: the source's dtype and config, and the tokenizer file when present."""
    folder = Path(folder)
    hf = read_json(folder, "config.json")
    cfg = huginn_config(hf, str(folder / "config.json"))
    tensors = read_weights(folder)
    state = huginn_state(tensors, cfg, str(folder))
    meta = {
        "format": MODEL_TYPE,
        "source_config": hf,
        "dtype": str(state["wte.weight"].dtype).removeprefix("torch."),
        "tokenizer": "tokenizer.json" if (folder / "tokenizer.json").is_file() else None,
    }
    return cfg, state, meta
