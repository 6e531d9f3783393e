"""Random checkpoints in the hub layouts of the formats loopnet imports, at any size, for the import benches
(`loopnet bench huginn-memory`, `loopnet bench import-speed`). `write_checkpoint(folder, sizes, fmt=...)`:

    huginn   Huginn-0125's (tomg-group-umd/huginn-0125): config.json with its keys (model_type huginn_raven),
             model-0000i-of-0000n.safetensors sharded as `save_pretrained` does with model.safetensors.index.json,
             generation_config.json, the tokenizer files; sizes: HUGINN_0125's keys (its own sizes the defaults)
    ouro     Ouro's (ByteDance/Ouro-1.4B): config.json with the keys OuroConfig.save_pretrained writes (model_type
             ouro, total_ut_steps), the sharded safetensors and index, generation_config.json, the tokenizer files
             (Ouro's special tokens at ids 0-2); sizes: every key of OURO_SIZES
    parcae   Parcae's (SandyResearch/parcae-140m): config.json with ParcaeConfig's fields (`_class_name`), model.pt
             (the state dict, as parcae_lm.save_pretrained writes it), the tokenizer files; sizes: every key of
             PARCAE_140M (its own sizes the defaults)

The weights are drawn tensor by tensor under each format's own names (the safetensors ones shard by shard: only one
shard's tensors are held at a time): matrices N(0, 0.02²), the norms' gains 1, the rotary tables (`freqs_cis`) the
table of `rope_base` as the reference stores it, Parcae's `A_log` 0 (A = 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from loopnet.formats import huginn

HUGINN_0125 = {  # Huginn-0125's own sizes (3.5 B parameters)
    "n_embd": 5280,
    "n_heads": 55,
    "intermediate_size": 17920,
    "vocab_size": 65536,
    "block_size": 4096,
    "n_layers_in_prelude": 2,
    "n_layers_in_recurrent_block": 4,
    "n_layers_in_coda": 2,
}
HUGINN_SPECIALS = {"bos_token": "<|begin_text|>", "eos_token": "<|end_text|>", "pad_token": "<|pad|>"}
OURO_SIZES = (  # the keys of an Ouro config.json that size the model; total_ut_steps is R
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "num_hidden_layers",
    "total_ut_steps",
)
OURO_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2, as in Ouro's vocabulary
PARCAE_140M = {  # parcae-small-140m's own sizes (parcae_lm/configs/parcae/parcae-small-140m.py)
    "n_embd": 768,
    "num_attention_heads": 6,
    "intermediate_size": 3072,
    "vocab_size": 32768,
    "block_size": 2048,
    "n_layers_in_prelude": 2,
    "n_layers_in_recurrent_block": 2,
    "n_layers_in_coda": 2,
    "mean_recurrence": 8,
    "mean_backprop_depth": 4,
}
PARCAE_SPECIALS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}

Shapes = dict[str, tuple[int, ...]]
Draw = Callable[[str, tuple[int, ...], torch.Generator], torch.Tensor]


def rope_table(head_dim: int, length: int, base: float, dtype: torch.dtype) -> torch.Tensor:
    """The rotary table Huginn and Parcae store as `freqs_cis`: [1, T, 1, d_h/2, 2], (cos, sin) of t·base^(-2i/d_h)."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)[None, :, None].to(dtype)


def drawer(dtype: torch.dtype, special: dict[str, Callable[[tuple[int, ...]], torch.Tensor]]) -> Draw:
    """Draws N(0, 0.02²), the norms' gains 1, and `special` (name suffix -> its tensor of a shape) as given."""

    def draw(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        for suffix, make in special.items():
            if name.endswith(suffix):
                return make(shape).to(dtype)
        if "norm" in name or "ln_" in name:
            return torch.ones(shape, dtype=dtype)
        return torch.empty(shape, dtype=dtype).normal_(0.0, 0.02, generator=gen)

    return draw


def count(shapes: Shapes, dtype: torch.dtype, files: int) -> dict:
    """{"parameters", "weight_bytes" (the stored tensors'), "files"}: the rotary table is no parameter."""
    params = sum(math.prod(s) for k, s in shapes.items() if k != "freqs_cis")
    return {"parameters": params, "weight_bytes": params * (torch.finfo(dtype).bits // 8), "files": files}


def write_sharded(folder: Path, shapes: Shapes, draw: Draw, dtype: torch.dtype, shard_bytes: int, seed: int) -> int:
    """The tensors of `shapes` in safetensors shards of at most `shard_bytes` with their index, split as
    `save_pretrained` does (a new shard once the next tensor would overflow). Returns the number of shards."""
    from safetensors.torch import save_file

    size = torch.finfo(dtype).bits // 8
    shards: list[list[str]] = [[]]
    filled = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * size
        if shards[-1] and filled + nbytes > shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += nbytes
    n = len(shards)
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    for i, names in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file({k: draw(k, shapes[k], gen) for k in names}, folder / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    total = sum(math.prod(s) for s in shapes.values()) * size
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return n


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def write_tokenizer(
    folder: Path,
    max_length: int,
    names: dict[str, str],
    leading: tuple[str, ...] = (),
    tokenizer_class: str = "PreTrainedTokenizerFast",
) -> None:
    """A byte-level BPE (no merges): the `leading` special tokens first, the 256 byte tokens, then the other
    special tokens `names` names (bos_token, ...)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(leading)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in dict.fromkeys([*leading, *names.values()])])
    tok.save(str(folder / "tokenizer.json"))
    write_json(folder / "special_tokens_map.json", names)
    config = {"tokenizer_class": tokenizer_class, "model_max_length": max_length, **names}
    write_json(folder / "tokenizer_config.json", config)


def huginn_config(sizes: dict, dtype: torch.dtype) -> dict:
    """config.json of a Huginn checkpoint of `sizes` (HUGINN_0125's keys), every other key as Huginn-0125's."""
    s = HUGINN_0125 | sizes
    d, heads = s["n_embd"], s["n_heads"]
    layers = s["n_layers_in_prelude"] + s["n_layers_in_recurrent_block"] + s["n_layers_in_coda"]
    std = math.sqrt(2 / (5 * d))
    return {
        "architectures": ["RavenForCausalLM"],
        "auto_map": {
            "AutoConfig": "raven_config_minimal.RavenConfig",
            "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM",
        },
        "model_type": huginn.MODEL_TYPE,
        "architecture_class_name": "RecurrentGPT",
        **huginn.REQUIRED,  # Huginn-0125's block, MLP, norm and injection
        "qk_bias": True,
        "tie_embeddings": True,
        **s,
        "n_layers": layers,
        "num_key_value_heads": heads,
        "head_dim": d // heads,
        "padded_vocab_size": s["vocab_size"],
        "padding_multiple": 4096,
        "rope_base": 50000,
        "norm_eps": 1e-6,
        "mean_recurrence": 32,
        "mean_backprop_depth": 8,
        "effective_expected_depth": 132,
        "init_strategy": "takase",
        "init_orthogonal": False,
        "init_values": {"std": std, "out_proj": std / math.sqrt(2 * layers), "embedding": std, "embed_scale": d**0.5},
        "state_init": "like-init",
        "sampling_scheme": "poisson-lognormal-filling",
        "test_time_noise": 0,
        "test_time_noise_type": "fixed",
        "activation_checkpoint_impl": "per-iteration",
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def huginn_shapes(config: dict) -> Shapes:
    """Huginn's stored tensors and their shapes, in the order of its modules (the tied head is not stored)."""
    d, heads, ffn = config["n_embd"], config["n_heads"], config["intermediate_size"]
    hd = d // heads
    shapes: Shapes = {"transformer.wte.weight": (config["vocab_size"], d)}
    for part, n in (
        ("prelude", config["n_layers_in_prelude"]),
        ("core_block", config["n_layers_in_recurrent_block"]),
        ("coda", config["n_layers_in_coda"]),
    ):
        for i in range(n):
            p = f"transformer.{part}.{i}."
            shapes |= {p + f"norm_{j}.weight": (d,) for j in (1, 2, 3, 4)}
            shapes |= {
                p + "attn.Wqkv.weight": (3 * d, d),
                p + "attn.qk_bias": (2, 1, heads, hd),
                p + "attn.proj.weight": (d, d),
                p + "mlp.fc.weight": (2 * ffn, d),
                p + "mlp.proj.weight": (d, ffn),
            }
        if part == "prelude":
            shapes["transformer.adapter.weight"] = (d, 2 * d)
    shapes["transformer.ln_f.weight"] = (d,)
    shapes["freqs_cis"] = (1, config["block_size"], 1, hd // 2, 2)
    return shapes


def write_huginn(folder: Path, sizes: dict, dtype: torch.dtype, shard_bytes: int, seed: int) -> dict:
    config = huginn_config(sizes, dtype)
    shapes = huginn_shapes(config)
    table = lambda _: rope_table(config["n_embd"] // config["n_heads"], config["block_size"], 50000, dtype)  # noqa: E731
    files = write_sharded(folder, shapes, drawer(dtype, {"freqs_cis": table}), dtype, shard_bytes, seed)
    write_json(folder / "config.json", config)
    write_json(folder / "generation_config.json", {"bos_token_id": 65504, "eos_token_id": 65505})
    write_tokenizer(folder, config["block_size"], HUGINN_SPECIALS)
    return count(shapes, dtype, files)


def ouro_config(sizes: dict, dtype: torch.dtype) -> dict:
    """config.json of an Ouro checkpoint of `sizes` (every key of OURO_SIZES), every other key as Ouro's."""
    missing = [k for k in OURO_SIZES if k not in sizes]
    if missing:
        raise ValueError(f"an Ouro checkpoint needs the sizes {', '.join(missing)}; fix: give every key of OURO_SIZES")
    return {
        "architectures": ["OuroForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_ouro.OuroConfig",
            "AutoModel": "modeling_ouro.OuroModel",
            "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM",
        },
        "bos_token_id": 0,
        "dtype": str(dtype).removeprefix("torch."),
        "early_exit_threshold": 1.0,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "layer_types": ["full_attention"] * sizes["num_hidden_layers"],
        "max_window_layers": 28,
        "model_type": "ouro",
        "pad_token_id": 0,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1_000_000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        **{k: sizes[k] for k in OURO_SIZES},
    }


def ouro_shapes(config: dict) -> Shapes:
    """Ouro's stored tensors and their shapes, in the order of its modules."""
    d, heads, ffn = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    hd, kv = d // heads, config["num_key_value_heads"] * (d // heads)
    shapes: Shapes = {"model.embed_tokens.weight": (config["vocab_size"], d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (heads * hd, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, heads * hd),
            p + "mlp.gate_proj.weight": (ffn, d),
            p + "mlp.up_proj.weight": (ffn, d),
            p + "mlp.down_proj.weight": (d, ffn),
        }
        shapes |= {p + f"{norm}.weight": (d,) for norm in ("input_layernorm", "input_layernorm_2")}
        shapes |= {p + f"{norm}.weight": (d,) for norm in ("post_attention_layernorm", "post_attention_layernorm_2")}
    shapes |= {"model.norm.weight": (d,), "model.early_exit_gate.weight": (1, d), "model.early_exit_gate.bias": (1,)}
    shapes["lm_head.weight"] = (config["vocab_size"], d)
    return shapes


def write_ouro(folder: Path, sizes: dict, dtype: torch.dtype, shard_bytes: int, seed: int) -> dict:
    config = ouro_config(sizes, dtype)
    shapes = ouro_shapes(config)
    files = write_sharded(folder, shapes, drawer(dtype, {}), dtype, shard_bytes, seed)
    write_json(folder / "config.json", config)
    write_json(folder / "generation_config.json", {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})
    names = dict.fromkeys(("bos_token", "eos_token", "pad_token", "unk_token"), OURO_SPECIALS[0])
    write_tokenizer(folder, config["max_position_embeddings"], names, OURO_SPECIALS, "GPT2Tokenizer")
    return count(shapes, dtype, files)


def parcae_config(sizes: dict) -> dict:
    """config.json of a Parcae checkpoint of `sizes` (PARCAE_140M's keys), every other field as parcae-140m's."""
    s = PARCAE_140M | sizes
    d, ffn, multiple = s["n_embd"], s["intermediate_size"], 64
    return {
        "name": "parcae-random",
        "hf_config": {},
        **s,
        "num_key_value_heads": s["num_attention_heads"],
        "padding_multiple": multiple,
        "padded_vocab_size": math.ceil(s["vocab_size"] / multiple) * multiple,
        "rope_settings": {"use_rope": True, "rope_condense_ratio": 1, "rope_base": 50000},
        "use_abacus": False,
        "randomize_positions_from": None,
        "block_class_name": "TransformerPreNormBlock",
        "norm_class_name": "RMSNorm",
        "attn_impl": "sdpa",
        "norm_eps": 1e-05,
        "mlp_class_name": "BaseMLP",
        "nonlin_name": "ReLU2",
        "bias": False,
        "qk_bias": False,
        "init_strategy": "scaled-zero",
        "init_orthogonal": True,
        "skip_initialization": False,
        "mup_model_scaling_factor": 1,
        "use_fused_head": "pytorch",
        "debias_attention": False,
        "center_attention": False,
        "clip_qkv": None,
        "qk_norm": True,
        "logit_softcap": None,
        "activation_checkpoint_impl": "per-iteration",
        "simple_ops": False,
        "strategy": "single",
        "injection_type": "diagonal",
        "state_init": "like-init",
        "recurrent_embedding_dimension": d,
        "recurrent_intermediation_embedding_dimension": ffn,
        "recurrent_num_attention_heads": None,
        "prelude_norm": True,
        "sampling_scheme": "poisson-truncated-full",
        "lockstep_n": False,
        "lockstep_k": False,
        "curriculum_target": "forward",
        "recurrent_iteration_method": "per-sequence",
        "tie_embeddings": True,
        "model_class_name": "Parcae",
        "_is_recurrent_block_config": False,
        "_class_name": "ParcaeConfig",
    }


def has_ve(layer: int, n: int) -> bool:
    """Parcae's alternating rule for value embeddings, the last layer included."""
    return layer % 2 == (n - 1) % 2


def parcae_shapes(config: dict) -> Shapes:
    """Parcae's state dict's tensors and their shapes, in the order of its modules (the tied head and the rotary
    table included, as torch.save of its state dict holds them). A layer has a value-embedding table by its index
    among the stored layers and a gate by its unrolled layer id against K·mean_backprop_depth, as the reference."""
    d, heads, ffn = config["n_embd"], config["num_attention_heads"], config["intermediate_size"]
    P, K, C = (config[f"n_layers_in_{part}"] for part in ("prelude", "recurrent_block", "coda"))
    hd, V, n = d // heads, config["padded_vocab_size"], P + K + C
    n_layer = K * config["mean_backprop_depth"]
    shapes: Shapes = {"freqs_cis": (1, config["block_size"], 1, hd // 2, 2), "transformer.wte.weight": (V, d)}

    def block(prefix: str, layer_id: int) -> Shapes:
        qkv = {prefix + f"attn.c_{x}.weight": (d, d) for x in "qkv"}
        gate = {prefix + "attn.ve_gate.weight": (heads, 32)} if has_ve(layer_id, n_layer) else {}
        bias = {prefix + "attn.qk_bias": (2, 1, heads, hd)} if config["qk_bias"] else {}
        return {prefix + "norm_1.weight": (d,), **bias, **qkv, prefix + "attn.c_proj.weight": (d, d), **gate} | {
            prefix + "norm_2.weight": (d,),
            prefix + "mlp.fc.weight": (ffn, d),
            prefix + "mlp.proj.weight": (d, ffn),
        }

    for i in range(P):
        shapes |= block(f"transformer.prelude.{i}.", i)
    shapes |= {"transformer.adapter.A_log": (d,), "transformer.adapter.dt_bias": (d,), "transformer.adapter.B": (d, d)}
    for j in range(K):
        shapes |= block(f"transformer.core_block.{j}.", P + j)
    shapes["transformer.C.weight"] = (d, d)
    for i in range(C):
        shapes |= block(f"transformer.coda.{i}.", P + K * config["mean_recurrence"] + i)
    shapes |= {"transformer.ln_f.weight": (d,), "transformer.ln_prelude.weight": (d,)}
    shapes |= {f"value_embeds.{u}.weight": (V, d) for u in range(n) if has_ve(u, n)}
    return shapes


def write_parcae(folder: Path, sizes: dict, dtype: torch.dtype, shard_bytes: int, seed: int) -> dict:
    del shard_bytes  # one model.pt, as the hub serves Parcae
    config = parcae_config(sizes)
    shapes = parcae_shapes(config)
    hd = config["n_embd"] // config["num_attention_heads"]
    special = {
        "freqs_cis": lambda _: rope_table(hd, config["block_size"], 50000, dtype),
        "A_log": torch.zeros,
    }
    draw, gen = drawer(dtype, special), torch.Generator().manual_seed(seed)
    state = {k: draw(k, shape, gen) for k, shape in shapes.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]  # tied: one tensor under both names
    torch.save(state, folder / "model.pt")
    write_json(folder / "config.json", config)
    write_tokenizer(folder, config["block_size"], PARCAE_SPECIALS)
    return count(shapes, dtype, 1)


WRITERS = {"huginn": write_huginn, "ouro": write_ouro, "parcae": write_parcae}


def write_checkpoint(
    folder: str | Path,
    sizes: dict,
    dtype: torch.dtype = torch.bfloat16,
    shard_bytes: int = 1 << 30,
    seed: int = 0,
    fmt: str = "huginn",
) -> dict:
    """Write the random checkpoint of `sizes` in the hub layout of `fmt` into `folder` (new or empty), safetensors
    sharded at `shard_bytes`. Returns {"parameters", "weight_bytes" (the stored tensors'), "files" (of weights)}."""
    if fmt not in WRITERS:
        raise ValueError(f"no checkpoint writer for the format {fmt!r}; fix: give one of {', '.join(WRITERS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return WRITERS[fmt](folder, sizes, dtype, shard_bytes, seed)
