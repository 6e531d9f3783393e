"""A pretrained GPT-2 or Llama-family model made a looped model by layer selection (the retrofitting-recurrence
recipe, arXiv 2511.07384, which converts TinyLlama, Llama and OLMo this way).

Of the L pretrained layers the first P become the prelude, the last C the coda, and the K layers just
before the coda the core that loops (TinyLlama's "4-8-4": prelude 0-3, core 10-17, coda 18-21; the layers
between prelude and core are dropped). Each round starts from a linear adapter on concat[state, prelude
output] initialised to [0 | I], so that it passes the prelude's output through and ignores the (random)
initial state: with no layer dropped, R = 1 computes what the pretrained model does; training then
teaches the loop to use more rounds. `plain` keeps every layer in the loop at R = 1 without injection:
the original model exactly, in loopnet's blocks.

GPT-2's block in loopnet's options: Pre-LN (`residual: preln`) with LayerNorm and biases (`norm:
layernorm`, `bias`), the tanh GELU MLP (`mlp: gelu_tanh`), learned absolute positions, a tied head and
the final LayerNorm. Its Conv1D weights are stored [in, out]: loopnet's Linear takes their transpose.
Llama's (`LlamaForCausalLM`, TinyLlama): Pre-LN with RMSNorm of its rms_norm_eps, a SwiGLU MLP (gate_proj
and up_proj stacked as fc1), RoPE of its rope_theta (pairs (i, i + d_h/2), as loopnet's), no biases,
usually an untied head, grouped-query attention (`n_kv_heads`); q_proj, k_proj, v_proj stacked as the fused
projection. rope_scaling is refused (loopnet has none).
"""

from __future__ import annotations

from pathlib import Path

import torch

from loopnet.formats.huginn import eps
from loopnet.formats.source import (
    ImportFormatError,
    check_keys,
    check_shapes,
    expected_keys,
    read_json,
    read_weights,
)
from loopnet.model.config import LoopConfig

# GPT-2 layer tensor -> (loopnet name in a block, transposed): Conv1D weights are [in, out].
LAYER_NAMES = {
    "ln_1.weight": ("attn.norm.weight", False),
    "ln_1.bias": ("attn.norm.bias", False),
    "attn.c_attn.weight": ("attn.f.qkv_proj.weight", True),
    "attn.c_attn.bias": ("attn.f.qkv_proj.bias", False),
    "attn.c_proj.weight": ("attn.f.o_proj.weight", True),
    "attn.c_proj.bias": ("attn.f.o_proj.bias", False),
    "ln_2.weight": ("ffn.norm.weight", False),
    "ln_2.bias": ("ffn.norm.bias", False),
    "mlp.c_fc.weight": ("ffn.f.fc1.weight", True),
    "mlp.c_fc.bias": ("ffn.f.fc1.bias", False),
    "mlp.c_proj.weight": ("ffn.f.fc2.weight", True),
    "mlp.c_proj.bias": ("ffn.f.fc2.bias", False),
}
MASK_BUFFERS = ("attn.bias", "attn.masked_bias")  # older checkpoints store the causal mask: constants, not weights


def gpt2_config(hf: dict, source: str = "config.json") -> LoopConfig:
    """The `LoopConfig` of a GPT-2 config.json with all L layers in the loop at R = 1 (the original model)."""
    if hf.get("model_type") != "gpt2":
        raise ImportFormatError(
            f"{source}: model_type is {hf.get('model_type')!r}, not 'gpt2'; fix: give a GPT-2 "
            f"folder (transformers' GPT2LMHeadModel.save_pretrained)"
        )
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ImportFormatError(
            f"{source}: activation_function={hf['activation_function']!r}; loopnet's GPT-2 block "
            f"uses the tanh GELU (gelu_new); fix: give a checkpoint with that activation"
        )
    unsupported = [k for k in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn") if hf.get(k)]
    if unsupported or not hf.get("scale_attn_weights", True):
        raise ImportFormatError(
            f"{source}: attention options loopnet does not compute "
            f"({', '.join(unsupported) or 'scale_attn_weights false'}); fix: give a standard GPT-2"
        )
    d = hf["n_embd"]
    return LoopConfig(
        vocab_size=hf["vocab_size"],
        seq_len=hf["n_positions"],
        d_model=d,
        n_heads=hf["n_head"],
        n_blocks=hf["n_layer"],
        n_rounds=1,
        mlp="gelu_tanh",
        ffn_width=hf.get("n_inner") or 4 * d,
        bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        positions="learned",
        norm="layernorm",
        norm_eps=eps(hf.get("layer_norm_epsilon", 1e-5), 1e-5),
        residual="preln",
        init="normal",
        init_std=hf.get("initializer_range", 0.02),
    )


def select_layers(n_layer: int, prelude: int | None, core: int | None, coda: int | None) -> dict[str, list[int]]:
    """The recipe's split of layers 0..L-1: prelude the first P, coda the last C, core the K before the coda.
    Defaults: P = C = L/6, K = L/3 (rounded down, each at least 1)."""
    P = max(n_layer // 6, 1) if prelude is None else prelude
    C = max(n_layer // 6, 1) if coda is None else coda
    K = max(n_layer // 3, 1) if core is None else core
    if P < 0 or C < 0 or K < 1 or P + K + C > n_layer:
        raise ValueError(
            f"--prelude {P} --core {K} --coda {C} do not fit in the model's {n_layer} layers "
            f"(P, C >= 0, K >= 1, P + K + C <= {n_layer}); fix: give smaller counts"
        )
    return {
        "prelude": list(range(P)),
        "core": list(range(n_layer - C - K, n_layer - C)),
        "coda": list(range(n_layer - C, n_layer)),
    }


LLAMA_LAYER = {
    "input_layernorm.weight": "attn.norm.weight",
    "self_attn.o_proj.weight": "attn.f.o_proj.weight",
    "post_attention_layernorm.weight": "ffn.norm.weight",
    "mlp.down_proj.weight": "ffn.f.fc2.weight",
}
# Separate Llama projections that loopnet stacks into one matrix, in the stacking order.
LLAMA_STACKED = {
    "attn.f.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "ffn.f.fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def llama_config(hf: dict, source: str = "config.json") -> LoopConfig:
    """The `LoopConfig` of a Llama config.json with all L layers in the loop at R = 1 (the original model)."""
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    refused = []
    rope = hf.get("rope_parameters") or {}  # transformers 5 writes rope_parameters, 4.x rope_theta and rope_scaling
    if hf.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        refused.append("rope_scaling")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        refused.append("attention_bias / mlp_bias")
    if hf.get("head_dim", d // heads) != d // heads:
        refused.append(f"head_dim={hf['head_dim']} != hidden_size/num_attention_heads")
    if hf.get("hidden_act", "silu") != "silu":
        refused.append(f"hidden_act={hf['hidden_act']}")
    if refused:
        raise ImportFormatError(
            f"{source}: {', '.join(refused)}: not in loopnet's blocks; fix: give a Llama without "
            f"them (no rope_scaling, no biases, SiLU)"
        )
    kv = hf.get("num_key_value_heads", heads)
    return LoopConfig(
        vocab_size=hf["vocab_size"],
        seq_len=hf["max_position_embeddings"],
        d_model=d,
        n_heads=heads,
        n_kv_heads=None if kv == heads else kv,
        n_blocks=hf["num_hidden_layers"],
        n_rounds=1,
        mlp="swiglu",
        ffn_width=hf["intermediate_size"],
        bias=False,
        tie_embeddings=hf.get("tie_word_embeddings", False),
        positions="rope",
        rope_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        norm="rmsnorm",
        norm_eps=eps(hf.get("rms_norm_eps", 1e-6), 1e-6),
        residual="preln",
        init="normal",
        init_std=hf.get("initializer_range", 0.02),
    )


FAMILIES = {"gpt2": gpt2_config, "llama": llama_config}


def source_layers(
    tensors: dict[str, torch.Tensor], family: str, source: str
) -> tuple[dict[str, torch.Tensor], dict[int, dict]]:
    """(embeddings, final norm and head by loopnet name, each layer's block tensors by loopnet name), every source
    tensor used (GPT-2's stored mask buffers dropped: constants) or refused in one line."""
    if family == "gpt2":
        top_names = {
            "wte.weight": "wte.weight",
            "wpe.weight": "wpe.weight",
            "ln_f.weight": "final_norm.weight",
            "ln_f.bias": "final_norm.bias",
            "lm_head.weight": "lm_head.weight",
        }
        strip, layer_prefix = "transformer.", "h"
    else:
        top_names = {
            "model.embed_tokens.weight": "wte.weight",
            "model.norm.weight": "final_norm.weight",
            "lm_head.weight": "lm_head.weight",
        }
        strip, layer_prefix = "", "model.layers"
    depth = layer_prefix.count(".") + 1
    top, raw, unused = {}, {}, set()
    for key, tensor in tensors.items():
        name = key.removeprefix(strip)
        parts = name.split(".")
        if name in top_names:
            top[top_names[name]] = tensor
        elif ".".join(parts[:depth]) == layer_prefix and len(parts) > depth + 1 and parts[depth].isdigit():
            raw.setdefault(int(parts[depth]), {})[".".join(parts[depth + 1 :])] = (key, tensor)
        else:
            unused.add(key)
    layers = {}
    for i, leaves in raw.items():
        block = layers[i] = {}
        if family == "gpt2":
            for leaf, (key, tensor) in leaves.items():
                if leaf in MASK_BUFFERS:
                    continue
                if leaf not in LAYER_NAMES:
                    unused.add(key)
                    continue
                target, transpose = LAYER_NAMES[leaf]
                block[target] = tensor.t() if transpose else tensor
            continue
        for target, parts in LLAMA_STACKED.items():
            if all(part in leaves for part in parts):
                block[target] = torch.cat([leaves.pop(part)[1] for part in parts])
        for leaf, (key, tensor) in leaves.items():
            if leaf in LLAMA_LAYER:
                block[LLAMA_LAYER[leaf]] = tensor
            else:
                unused.add(key)
    if unused:
        check_keys(source, unused, set(), set())
    return top, layers


def retrofit(
    folder: str | Path,
    prelude: int | None = None,
    core: int | None = None,
    coda: int | None = None,
    rounds: int = 4,
    plain: bool = False,
) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """(LoopConfig, state dict, layer split) of the GPT-2 or Llama folder retrofitted as the module says."""
    folder = Path(folder)
    hf = read_json(folder, "config.json")
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise ImportFormatError(
            f"{folder / 'config.json'}: model_type {family!r}; loopnet retrofits "
            f"{' and '.join(FAMILIES)} models; fix: give such a folder (save_pretrained's)"
        )
    base = FAMILIES[family](hf, str(folder / "config.json"))
    L = base.n_blocks
    if plain:
        split = {"prelude": [], "core": list(range(L)), "coda": []}
        config = base
    else:
        if rounds < 1:
            raise ValueError(f"--rounds {rounds} must be >= 1; fix: give the mean rounds to train with, e.g. 4")
        split = select_layers(L, prelude, core, coda)
        # The recipe's noise initial state: the [0 | I] adapter ignores it at first; training may learn to read it.
        config = LoopConfig(
            **{
                **base.architecture(),
                "n_prelude": len(split["prelude"]),
                "n_blocks": len(split["core"]),
                "n_coda": len(split["coda"]),
                "n_rounds": rounds,
                "wiring": "inject",
                "injection": "linear",
                "inject_into": "first",
                "state_init": "random",
            }
        )
    top, layers = source_layers(read_weights(folder), family, str(folder))
    missing_layers = [i for i in range(L) if i not in layers]
    if missing_layers or max(layers, default=-1) >= L:
        raise ImportFormatError(
            f"{folder}: config.json says n_layer={L} but the weights hold layers "
            f"{sorted(layers)}; fix: give the config.json that belongs to these weights"
        )
    state = dict(top)
    if config.tie_embeddings:
        tied = state.pop("lm_head.weight", None)
        if tied is not None and not torch.equal(tied, state["wte.weight"]):
            raise ImportFormatError(
                f"{folder}: lm_head.weight differs from wte.weight although the head is tied; "
                f"fix: set tie_word_embeddings false in config.json"
            )
        state["lm_head.weight"] = state["wte.weight"]
    for part, prefix in (("prelude", "prelude"), ("core", "blocks"), ("coda", "coda")):
        for j, i in enumerate(split[part]):
            state.update({f"{prefix}.{j}.{name}": t for name, t in layers[i].items()})
    if config.injection == "linear":
        d = config.d_model
        adapter = torch.zeros(d, 2 * d, dtype=state["wte.weight"].dtype)
        adapter[:, d:] = torch.eye(d)  # adapter(concat[x, e]) = e
        state["injection.adapter.weight"] = adapter
        if config.bias:
            state["injection.adapter.bias"] = torch.zeros(d, dtype=adapter.dtype)
    shapes = expected_keys(config)
    check_keys(str(folder), set(), set(shapes), set(state))
    check_shapes(str(folder), state, shapes)
    return config, state, split
