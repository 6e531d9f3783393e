"""Parcae (SandyResearch/parcae, PyPI `parcae-lm`) read into a `LoopConfig` and a loopnet state dict.

A Parcae folder as the hub serves it: `config.json` (the `ParcaeConfig` dataclass's fields, with
`_class_name: ParcaeConfig`), a plain torch state dict (`pytorch_model.bin` or `model.pt`, or
`model.safetensors`), and the tokenizer (SandyResearch/parcae-tokenizer's `tokenizer.json`). The reference loads
the weights with strict=False; this reader uses every tensor and fills every weight, else it names the keys.

Parcae's architecture in loopnet's options: Pre-LN blocks (RMSNorm with gains), attention with separate
q, k, v projections, RoPE and a parameter-free qk-norm (`qk_norm_gain: false`), the ReLU² MLP (`mlp: relu2`),
nanochat's value embeddings (`value_embeds`), prelude / core / coda, `ln_prelude` on the loop's input
(`prelude_norm`), the diagonal (or linear) injection from a random state (`state_init: random`), C on the
loop's output (`loop_proj`), ln_f and the tied head. Names:

    transformer.wte / ln_f / ln_prelude / C       wte / final_norm / prelude_norm / loop_proj
    transformer.adapter.{A_log, dt_bias, B}       injection.{A_log, dt, B}  (adapter.adapter: injection.adapter)
    transformer.prelude.i, core_block.i, coda.i   prelude.i, blocks.i, coda.i, each with
        norm_1, norm_2                            attn.norm, ffn.norm
        attn.c_q, c_k, c_v (stacked), c_proj      attn.f.qkv_proj, attn.f.o_proj
        attn.qk_bias, attn.ve_gate                attn.f.qk_bias, attn.f.value_gate
        mlp.fc, mlp.proj                          ffn.f.fc1, ffn.f.fc2
    value_embeds.u                                (stored block u).attn.f.value_embed
    lm_head (tied), freqs_cis (the RoPE table)    checked against wte and loopnet's own table

Parcae rotates the interleaved pairs (2i, 2i+1), loopnet (i, i + d_h/2): each head's query and key rows are
permuted as for Huginn (`huginn.interleaved_to_half`)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from loopnet.formats.huginn import _check_rope_table, eps, interleaved_to_half
from loopnet.formats.source import ImportFormatError, check_keys, check_shapes, expected_keys, read_json
from loopnet.model.config import LoopConfig

CLASS_NAME = "ParcaeConfig"
WEIGHT_FILES = ("pytorch_model.bin", "model.pt", "model.safetensors")  # the names the reference's loaders try
TOKENIZER_SRC = "hf://SandyResearch/parcae-tokenizer"  # the reference's tokenizer when the model folder has none
PREFIXES = ("module.", "_orig_mod.", "model.")  # wrappers the reference's eval loader strips from the keys
# What loopnet computes as the released Parcae models do; a config naming anything else is refused.
REQUIRED = {
    "block_class_name": "TransformerPreNormBlock",
    "norm_class_name": "RMSNorm",
    "bias": False,
    "clip_qkv": None,
    "logit_softcap": None,
    "mup_model_scaling_factor": 1,
    "use_abacus": False,
}
MLPS = {("BaseMLP", "ReLU2"): "relu2", ("BaseMLP", "GELU"): "gelu", ("GatedMLP", "SiLU"): "swiglu"}
# Init strategies whose tables scale the logits (logit_scale != 1): loopnet's head has no such multiplier.
LOGIT_SCALED = {
    "llama-by-dim-ls",
    "noci-anagnostidis",
    "shaped",
    "deep-scale-simple",
    "deep-scale-full",
    "scaled-and-logit-scale",
    "takase-scaled",
}
ROUND_DRAWS = {"per-batch": "batch", "per-sequence": "sequence"}  # recurrent_iteration_method -> round_draw
EMBED_SCALED = {"takase"}  # embed_scale √d, loopnet's embed_scale
BLOCK_NAMES = {
    "norm_1.weight": "attn.norm.weight",
    "norm_2.weight": "ffn.norm.weight",
    "attn.c_proj.weight": "attn.f.o_proj.weight",
    "attn.ve_gate.weight": "attn.f.value_gate.weight",
    "mlp.fc.weight": "ffn.f.fc1.weight",
    "mlp.proj.weight": "ffn.f.fc2.weight",
}
PARTS = {"prelude": "prelude", "core_block": "blocks", "coda": "coda"}
TOP = {
    "transformer.wte.weight": "wte.weight",
    "transformer.ln_f.weight": "final_norm.weight",
    "transformer.ln_prelude.weight": "prelude_norm.weight",
    "transformer.C.weight": "loop_proj.weight",
    "transformer.adapter.A_log": "injection.A_log",
    "transformer.adapter.dt_bias": "injection.dt",
    "transformer.adapter.B": "injection.B",
    "transformer.adapter.adapter.weight": "injection.adapter.weight",
}


def is_parcae(folder: Path) -> bool:
    path = Path(folder) / "config.json"
    return path.is_file() and read_json(Path(folder), "config.json").get("_class_name") == CLASS_NAME


def _refuse(source: str, what: str) -> ImportFormatError:
    return ImportFormatError(
        f"{source}: {what}, which loopnet does not compute; fix: give a released Parcae checkpoint"
    )


def _has_ve(i: int, n: int) -> bool:
    return i % 2 == (n - 1) % 2  # the reference's alternating rule, the last layer included


def parcae_config(hf: dict, source: str = "config.json") -> LoopConfig:
    """The `LoopConfig` of a Parcae config.json (a dict). R = its `mean_recurrence`; training draws rounds as
    its `poisson-truncated-full` does, with its mean backprop depth, per sequence or per batch as its
    `recurrent_iteration_method` says."""
    if hf.get("_class_name", CLASS_NAME) != CLASS_NAME or "injection_type" not in hf:
        raise ImportFormatError(
            f"{source}: not a Parcae config (_class_name {hf.get('_class_name')!r}, no injection_type); fix: give a "
            f"Parcae folder (SandyResearch/parcae-140m) or the importer of its format"
        )
    for key, value in REQUIRED.items():
        if hf.get(key, value) != value:
            raise _refuse(source, f"{key}={hf[key]!r} (loopnet reads {value!r})")
    d, heads = hf["n_embd"], hf["num_attention_heads"]
    ffn = hf.get("intermediate_size") or 4 * d
    if hf.get("num_key_value_heads") not in (None, heads):
        raise _refuse(
            source, f"num_key_value_heads={hf['num_key_value_heads']} (grouped-query attention outside the core)"
        )
    recurrent = (
        hf.get("recurrent_embedding_dimension", d),
        hf.get("recurrent_intermediation_embedding_dimension", ffn),
    )
    if recurrent != (d, ffn) or hf.get("recurrent_num_attention_heads") not in (None, heads):
        raise _refuse(source, f"a core of width {recurrent[0]} and FFN {recurrent[1]} beside n_embd {d}, FFN {ffn}")
    mlp = MLPS.get((hf.get("mlp_class_name", "BaseMLP"), hf.get("nonlin_name", "GELU")))
    if mlp is None:
        raise _refuse(source, f"mlp {hf.get('mlp_class_name')} with {hf.get('nonlin_name')}")
    if hf["injection_type"] not in ("diagonal", "linear"):
        raise _refuse(source, f"injection_type={hf['injection_type']!r} (loopnet reads diagonal and linear)")
    strategy = hf.get("init_strategy", "scaled")
    if strategy in LOGIT_SCALED:
        raise _refuse(source, f"init_strategy={strategy!r}, whose logit_scale multiplies the logits")
    rope = hf.get("rope_settings") or {}
    if not rope.get("use_rope", True):
        raise _refuse(source, "use_rope false")
    P, K, C = hf["n_layers_in_prelude"], hf["n_layers_in_recurrent_block"], hf["n_layers_in_coda"]
    mean, depth = hf.get("mean_recurrence", 32), hf.get("mean_backprop_depth", 8)
    method = hf.get("recurrent_iteration_method", "per-batch")  # the reference's default
    if method not in ROUND_DRAWS:
        raise _refuse(source, f"recurrent_iteration_method={method!r} (loopnet draws per-batch or per-sequence)")
    # The reference gives a layer a table by its index among the P + K + C stored layers and a gate by its
    # unrolled layer id against K·mean_backprop_depth; loopnet's one rule holds when the two sets agree.
    n, n_layer = P + K + C, K * depth
    tables = {u for u in range(n) if _has_ve(u, n)}
    ids = [*range(P), *(P + j for j in range(K)), *(P + K * mean + i for i in range(C))]
    gates = {u for u, lid in enumerate(ids) if _has_ve(lid, n_layer)}
    if tables != gates:
        raise _refuse(source, f"value embeddings in layers {sorted(tables)} but their gates in {sorted(gates)}")
    padded = hf.get("padded_vocab_size") or math.ceil(hf["vocab_size"] / hf.get("padding_multiple", 512)) * hf.get(
        "padding_multiple", 512
    )
    return LoopConfig(
        vocab_size=padded,
        seq_len=hf["block_size"],
        d_model=d,
        n_heads=heads,
        n_blocks=K,
        n_rounds=mean,
        n_prelude=P,
        n_coda=C,
        mlp=mlp,
        ffn_width=ffn,
        bias=False,
        tie_embeddings=hf.get("tie_embeddings", False),
        positions="rope",
        rope_base=float(rope.get("rope_base", 50_000)),
        qk_bias=hf.get("qk_bias", False),
        qk_norm=hf.get("qk_norm", False),
        qk_norm_gain=False,
        norm="rmsnorm",
        residual="preln",
        wiring="inject",
        injection=hf["injection_type"],
        inject_into="first",
        norm_eps=eps(hf.get("norm_eps", 1e-5), 1e-6),
        embed_scale=strategy in EMBED_SCALED,
        prelude_norm=hf.get("prelude_norm", False),
        loop_proj=True,
        value_embeds=True,
        state_init="zero" if hf.get("state_init", "like-init") == "zero" else "random",
        init="normal",
        init_std=math.sqrt(2 / (5 * d)),  # the "scaled" tables' std: its init and its like-init state's
        round_sampling="poisson_truncated",
        round_draw=ROUND_DRAWS[method],
        backprop_rounds=min(depth, mean),
    )


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's state dict (memory-mapped), the wrapper prefixes the reference strips removed."""
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                tensors = load_file(path)
            else:
                tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            break
    else:
        raise ImportFormatError(
            f"{folder}: none of {', '.join(WEIGHT_FILES)}; fix: give the model's folder as the hub serves it"
        )
    out = {}
    for key, value in tensors.items():
        for prefix in PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def _block_index(cfg: LoopConfig) -> list[str]:
    """loopnet's block prefix of each stored layer u (prelude, core, coda)."""
    return [
        *(f"prelude.{i}" for i in range(cfg.n_prelude)),
        *(f"blocks.{j}" for j in range(cfg.n_blocks)),
        *(f"coda.{i}" for i in range(cfg.n_coda)),
    ]


def parcae_state(tensors: dict[str, torch.Tensor], cfg: LoopConfig, source: str = "weights") -> dict[str, torch.Tensor]:
    """loopnet's state dict from Parcae's tensors, every tensor used and every weight filled (else one line naming
    the keys); tensors keep their dtype."""
    shapes = expected_keys(cfg)
    remaining = dict(tensors)
    state: dict[str, torch.Tensor] = {}
    H, hd = cfg.n_heads, cfg.head_dim
    order = interleaved_to_half(hd)
    rows = lambda w: w.reshape(H, hd, -1)[:, order].reshape(H * hd, -1)  # noqa: E731
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    blocks = _block_index(cfg)
    for name in list(remaining):
        parts = name.split(".")
        if name == "freqs_cis":
            _check_rope_table(source, remaining.pop(name), cfg)
        elif name in TOP:
            state[TOP[name]] = remaining.pop(name)
        elif parts[0] == "value_embeds" and len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < len(blocks):
            state[f"{blocks[int(parts[1])]}.attn.f.value_embed.weight"] = remaining.pop(name)
        elif parts[0] == "transformer" and parts[1] in PARTS and len(parts) > 3:
            leaf, block = ".".join(parts[3:]), f"{PARTS[parts[1]]}.{parts[2]}"
            if leaf in BLOCK_NAMES:
                state[f"{block}.{BLOCK_NAMES[leaf]}"] = remaining.pop(name)
            elif leaf in ("attn.c_q.weight", "attn.c_k.weight", "attn.c_v.weight"):
                qkv.setdefault(block, {})[leaf[7]] = remaining.pop(name)
            elif leaf == "attn.qk_bias":  # [2, 1, H, d_h] -> loopnet's [2, H, 1, d_h], pairs reordered
                state[f"{block}.attn.f.qk_bias"] = remaining.pop(name).transpose(1, 2)[..., order]
    for block, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            lacking = ", ".join(f"{block} c_{p}" for p in "qkv" if p not in parts)
            raise ImportFormatError(f"{source}: the attention lacks {lacking}; fix: give an unmodified checkpoint")
        state[f"{block}.attn.f.qkv_proj.weight"] = torch.cat([rows(parts["q"]), rows(parts["k"]), parts["v"]])
    head = remaining.pop("lm_head.weight", None)
    if cfg.tie_embeddings:
        if head is not None and "wte.weight" in state and not torch.equal(head, state["wte.weight"]):
            raise ImportFormatError(
                f"{source}: lm_head.weight differs from transformer.wte.weight although tie_embeddings is true; "
                f"fix: set tie_embeddings false in config.json"
            )
        if "wte.weight" in state:
            state["lm_head.weight"] = state["wte.weight"]
    elif head is not None:
        state["lm_head.weight"] = head
    check_keys(source, set(remaining), set(shapes), set(state))
    check_shapes(source, state, shapes)
    return state


def read_parcae(folder: str | Path) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """(LoopConfig, state dict, meta) of a Parcae folder as the hub serves it."""
    folder = Path(folder)
    hf = read_json(folder, "config.json")
    cfg = parcae_config(hf, str(folder / "config.json"))
    state = parcae_state(read_tensors(folder), cfg, str(folder))
    meta = {
        "format": "parcae",
        "source_config": hf,
        "dtype": str(state["wte.weight"].dtype).removeprefix("torch."),
        "tokenizer": "tokenizer.json" if (folder / "tokenizer.json").is_file() else None,
    }
    return cfg, state, meta
