"""Ouro (ByteDance/Ouro-1.4B, Ouro-2.6B and their Thinking variants: `model_type ouro`, remote code
`modeling_ouro.py`) read into a `LoopConfig` and a loopnet state dict.

Ouro's architecture in loopnet's options: no prelude or coda, its whole layer stack the loop (K =
`num_hidden_layers`, R = `total_ut_steps`); a Pre-LN block with a Norm on each branch output too (`residual:
preln`, `sandwich`: x ← x + Norm₂(attn(Norm₁ x)), x ← x + Norm₄(mlp(Norm₃ x))); the final Norm after every round,
the next round starting from it and the head reading it (`round_norm`); SwiGLU of width `intermediate_size`;
RoPE of base `rope_theta`; grouped-query attention when `num_key_value_heads` < heads; an untied head; the
learned exit gate (`exit_gate`) and its expected-logits loss (`loss_rounds: expected`). Its names map one to one
onto loopnet's:

    model.embed_tokens / norm / early_exit_gate       wte / final_norm / exit_gate
    model.layers.i.                                   blocks.i.
        input_layernorm, input_layernorm_2            attn.norm, attn.out_norm
        post_attention_layernorm, ..._2               ffn.norm, ffn.out_norm
        self_attn.q_proj, k_proj, v_proj              attn.f.qkv_proj (stacked [q; k; v])
        self_attn.o_proj                              attn.f.o_proj
        mlp.gate_proj, up_proj, down_proj             ffn.f.fc1 (stacked [gate; up]), ffn.f.fc2
    lm_head                                           lm_head

Its rotary embedding rotates the halves (i, i + d_h/2) of a head, as loopnet's does: no permutation."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from loopnet.formats.huginn import eps
from loopnet.formats.source import ImportFormatError, check_keys, check_shapes, expected_keys, read_json, read_weights
from loopnet.model.config import LoopConfig

MODEL_TYPE = "ouro"
BLOCK_NAMES = {
    "input_layernorm.weight": "attn.norm.weight",
    "input_layernorm_2.weight": "attn.out_norm.weight",
    "post_attention_layernorm.weight": "ffn.norm.weight",
    "post_attention_layernorm_2.weight": "ffn.out_norm.weight",
    "self_attn.o_proj.weight": "attn.f.o_proj.weight",
    "mlp.down_proj.weight": "ffn.f.fc2.weight",
}
STACKED = {  # loopnet's fused matrices and the reference's parts, in their order
    "attn.f.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "ffn.f.fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
TOP_NAMES = {
    "model.embed_tokens.weight": "wte.weight",
    "model.norm.weight": "final_norm.weight",
    "model.early_exit_gate.weight": "exit_gate.weight",
    "model.early_exit_gate.bias": "exit_gate.bias",
}
SPECIAL = ("bos", "eos", "pad")


def is_ouro(folder: Path) -> bool:
    path = Path(folder) / "config.json"
    return path.is_file() and read_json(Path(folder), "config.json").get("model_type") == MODEL_TYPE


def _refuse(source: str, what: str, fix: str) -> None:
    raise ImportFormatError(f"{source}: {what}, which loopnet does not compute as Ouro does; fix: {fix}")


def ouro_config(hf: dict, source: str = "config.json") -> LoopConfig:
    """The `LoopConfig` of an Ouro config.json (a dict): R = its `total_ut_steps`, the loss its expected logits."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ImportFormatError(
            f"{source}: model_type is {hf.get('model_type')!r}, not {MODEL_TYPE!r}; fix: give an Ouro folder "
            f"(ByteDance/Ouro-1.4B) or the importer of its format"
        )
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(source, f"hidden_act={hf['hidden_act']!r} (Ouro's MLP is SwiGLU, silu)", "give an Ouro checkpoint")
    if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or []):
        _refuse(source, "sliding-window attention is on", "give a checkpoint with use_sliding_window false")
    scaling = hf.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        _refuse(source, f"rope_scaling={scaling}", "give a checkpoint with rope_scaling null")
    if hf.get("head_dim", d // heads) != d // heads:
        _refuse(source, f"head_dim={hf['head_dim']} differs from hidden_size/num_attention_heads", "give Ouro's own")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        _refuse(source, "attention_bias or mlp_bias is set (Ouro's projections have none)", "give Ouro's own")
    kv = hf.get("num_key_value_heads") or heads
    return LoopConfig(
        vocab_size=hf["vocab_size"],
        seq_len=hf["max_position_embeddings"],
        d_model=d,
        n_heads=heads,
        n_kv_heads=None if kv == heads else kv,
        n_blocks=hf["num_hidden_layers"],
        n_rounds=hf.get("total_ut_steps", 4),
        mlp="swiglu",
        ffn_width=hf["intermediate_size"],
        bias=False,
        tie_embeddings=hf.get("tie_word_embeddings", False),
        positions="rope",
        rope_base=float(hf.get("rope_theta", 10_000.0)),
        norm="rmsnorm",
        norm_eps=eps(hf.get("rms_norm_eps", 1e-6), 1e-6),
        residual="preln",
        sandwich=True,
        wiring="carry",
        round_norm=True,
        exit_gate=True,
        loss_rounds="expected",
        init="normal",
        init_std=hf.get("initializer_range", 0.02),
    )


def ouro_state(tensors: dict[str, torch.Tensor], cfg: LoopConfig, source: str = "weights") -> dict[str, torch.Tensor]:
    """loopnet's state dict from Ouro's tensors, every tensor used and every weight filled (else one line naming
    the keys); tensors keep their dtype."""
    shapes = expected_keys(cfg)
    remaining = dict(tensors)
    state: dict[str, torch.Tensor] = {}
    for name, target in TOP_NAMES.items():
        if name in remaining:
            state[target] = remaining.pop(name)
    if "lm_head.weight" in remaining and not cfg.tie_embeddings:
        state["lm_head.weight"] = remaining.pop("lm_head.weight")
    for i in range(cfg.n_blocks):
        prefix = f"model.layers.{i}."
        for leaf, target in BLOCK_NAMES.items():
            if prefix + leaf in remaining:
                state[f"blocks.{i}.{target}"] = remaining.pop(prefix + leaf)
        for target, parts in STACKED.items():
            if all(prefix + p in remaining for p in parts):
                state[f"blocks.{i}.{target}"] = torch.cat([remaining.pop(prefix + p) for p in parts])
    tied = remaining.pop("lm_head.weight", None) if cfg.tie_embeddings else None
    if tied is not None and "wte.weight" in state and not torch.equal(tied, state["wte.weight"]):
        raise ImportFormatError(
            f"{source}: lm_head.weight differs from model.embed_tokens.weight although tie_word_embeddings "
            f"is true; fix: set tie_word_embeddings false in config.json"
        )
    if cfg.tie_embeddings and "wte.weight" in state:
        state["lm_head.weight"] = state["wte.weight"]
    check_keys(source, set(remaining), set(shapes), set(state))
    check_shapes(source, state, shapes)
    return state


def special_tokens(folder: Path, hf: dict) -> dict:
    """The bos, eos and pad ids each of the folder's files names: config.json's and generation_config.json's ids,
    and the tokens tokenizer_config.json and special_tokens_map.json name (through tokenizer.json). Ouro's files
    need not agree (its chat variants end a turn with <|im_end|>, id 2, while the hub's files name <|endoftext|>,
    id 0); `agree` says whether they do."""
    named: dict[str, dict] = {"config.json": {k: hf.get(f"{k}_token_id") for k in SPECIAL}}
    if (folder / "generation_config.json").is_file():
        generation = json.loads((folder / "generation_config.json").read_text())
        named["generation_config.json"] = {k: generation.get(f"{k}_token_id") for k in SPECIAL}
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            if (folder / name).is_file():
                meta = json.loads((folder / name).read_text())
                tokens = {k: meta.get(f"{k}_token") for k in SPECIAL}
                tokens = {k: t.get("content") if isinstance(t, dict) else t for k, t in tokens.items()}
                named[name] = {k: (tok.token_to_id(t) if isinstance(t, str) else None) for k, t in tokens.items()}
    ids = {k: {v[k] for v in named.values() if v.get(k) is not None} for k in SPECIAL}
    return {"files": named, "agree": all(len(v) <= 1 for v in ids.values())}


def read_ouro(folder: str | Path) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """(LoopConfig, state dict, meta) of an Ouro folder as the hub serves it (config.json, safetensors weights with
    or without their index). `meta`: the source's dtype and config, its exit threshold, the special-token ids its
    files name, and the tokenizer file when present."""
    folder = Path(folder)
    hf = read_json(folder, "config.json")
    cfg = ouro_config(hf, str(folder / "config.json"))
    state = ouro_state(read_weights(folder), cfg, str(folder))
    meta = {
        "format": MODEL_TYPE,
        "source_config": hf,
        "dtype": str(state["wte.weight"].dtype).removeprefix("torch."),
        "early_exit_threshold": hf.get("early_exit_threshold"),
        "special_tokens": special_tokens(folder, hf),
        "tokenizer": "tokenizer.json" if (folder / "tokenizer.json").is_file() else None,
    }
    return cfg, state, meta
