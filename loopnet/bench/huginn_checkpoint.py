"""A random checkpoint in Huginn-0125's hub layout (tomg-group-umd/huginn-0125) at any size, for the import benches
(`loopnet bench huginn-memory`, `loopnet bench huginn-speed`).

    config.json                         the keys of Huginn-0125's (model_type huginn_raven), at the given sizes
    model-0000i-of-0000n.safetensors    the weights under Huginn's names, sharded as `save_pretrained` does
    model.safetensors.index.json        weight_map and total_size
    tokenizer.json, tokenizer_config.json, special_tokens_map.json   a byte-level BPE with Huginn's special tokens

The weights are drawn shard by shard (only one shard's tensors are held at a time): matrices N(0, 0.02²), the
norms' gains 1, `qk_bias` N(0, 0.02²), and `freqs_cis` the rotary table of `rope_base`, as the reference stores it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

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
SPECIALS = {"bos_token": "<|begin_text|>", "eos_token": "<|end_text|>", "pad_token": "<|pad|>"}


def hub_config(sizes: dict, dtype: torch.dtype) -> dict:
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
        "model_type": "huginn_raven",
        "architecture_class_name": "RecurrentGPT",
        "block_class_name": "SandwichBlock",
        "mlp_class_name": "GatedMLP",
        "nonlin_name": "SiLU",
        "norm_class_name": "RMSNorm_llama",
        "injection_type": "linear",
        "bias": False,
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


def weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Huginn's stored tensors and their shapes, in the order of its modules (the tied head is not stored)."""
    d, heads, ffn = config["n_embd"], config["n_heads"], config["intermediate_size"]
    hd = d // heads
    shapes: dict[str, tuple[int, ...]] = {"transformer.wte.weight": (config["vocab_size"], d)}
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


def draw(name: str, shape: tuple[int, ...], config: dict, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if name == "freqs_cis":  # the reference's precompute_freqs_cis: (cos, sin) of t·base^(-2i/d_h)
        hd = config["n_embd"] // config["n_heads"]
        inv = config["rope_base"] ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angles = torch.outer(torch.arange(config["block_size"], dtype=torch.float32), inv)
        return torch.stack([angles.cos(), angles.sin()], dim=-1)[None, :, None].to(dtype)
    if "norm_" in name or "ln_f" in name:
        return torch.ones(shape, dtype=dtype)
    return torch.empty(shape, dtype=dtype).normal_(0.0, 0.02, generator=gen)


def write_checkpoint(
    folder: str | Path, sizes: dict, dtype: torch.dtype = torch.bfloat16, shard_bytes: int = 1 << 30, seed: int = 0
) -> dict:
    """Write the random checkpoint of `sizes` into `folder` (new or empty), sharded at `shard_bytes`.
    Returns {"parameters", "weight_bytes" (the stored tensors'), "files"}."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = hub_config(sizes, dtype)
    shapes = weight_shapes(config)
    size = torch.finfo(dtype).bits // 8
    shards: list[list[str]] = [[]]
    filled = 0
    for name, shape in shapes.items():  # save_pretrained's split: a new shard once the next tensor would overflow
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
        save_file({k: draw(k, shapes[k], config, dtype, gen) for k in names}, folder / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    total = sum(math.prod(s) for s in shapes.values()) * size
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 65504, "eos_token_id": 65505}) + "\n")
    write_tokenizer(folder, config["block_size"])
    params = sum(math.prod(s) for k, s in shapes.items() if k != "freqs_cis")
    return {"parameters": params, "weight_bytes": params * size, "files": n}


def write_tokenizer(folder: Path, max_length: int) -> None:
    """A byte-level BPE (256 byte tokens, no merges) plus Huginn's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS.values()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIALS, indent=2) + "\n")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length, **SPECIALS}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
