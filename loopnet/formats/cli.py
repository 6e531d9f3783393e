"""The format commands: `loopnet export CKPT OUT` writes a checkpoint's model, `loopnet import SRC OUT` and
`loopnet retrofit SRC OUT` a model another library wrote (SRC a local folder or `hf://org/name[@revision]`), each
as loopnet's model folder in the Hugging Face layout, through its one writer (`loopnet.formats.hf.write_model`).

    loopnet export runs/<run>/version_0/checkpoints/last.ckpt exported/ [--dtype bfloat16] [--overwrite]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loopnet.env import one_line_errors

IMPORT_EXAMPLE = "loopnet import hf://tomg-group-umd/huginn-0125@<commit> models/huginn-0125"


def _source(folder: Path, src: str) -> dict:
    """What the written folder records of its source (config.json's `loopnet_export.source`, with what the reader
    adds): the argument, and the hub commit when downloaded."""
    source = {"src": src}
    if src.startswith("hf://") and folder.parent.name == "snapshots":
        source["commit"] = folder.name  # the cache's snapshot folder is named by the resolved commit
    return source


def import_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="loopnet import",
        description=(
            "Read a released looped LM (Huginn: config.json with model_type huginn_raven; Ouro: model_type ouro; "
            "both with safetensors weights and tokenizer.json; Parcae: config.json with _class_name ParcaeConfig, "
            "pytorch_model.bin or model.pt) and write it as a loopnet model folder (the layout of loopnet export). "
            "Example: " + IMPORT_EXAMPLE
        ),
    )
    parser.add_argument("src", help="a local folder laid out as the hub serves the model, or hf://org/name[@revision]")
    parser.add_argument("out", help="the folder to write (must not exist, or be empty)")
    args = parser.parse_args(argv)
    from loopnet.formats import hf, huginn, ouro, parcae, source

    with one_line_errors("loopnet import", (ValueError, FileNotFoundError)):
        hf.check_destination(Path(args.out))
        src = source.resolve(args.src)
        src_config = source.read_json(src, "config.json")
        kind = src_config.get("model_type")
        tokenizer_dir = src
        readers = {huginn.MODEL_TYPE: huginn.read_huginn, ouro.MODEL_TYPE: ouro.read_ouro}
        if src_config.get("_class_name") == parcae.CLASS_NAME:
            config, state, meta = parcae.read_parcae(src)
            if meta["tokenizer"] is None and args.src.startswith(source.HF_SCHEME):
                tokenizer_dir = source.resolve(parcae.TOKENIZER_SRC)  # the hub keeps Parcae's tokenizer apart
        elif kind in readers:
            config, state, meta = readers[kind](src)
        else:
            hint = "; a non-looped GPT-2 becomes a looped model with `loopnet retrofit`" if kind == "gpt2" else ""
            raise ValueError(
                f"{args.src}: model_type {kind!r} is not one loopnet imports ({', '.join(readers)}, or a Parcae "
                f"config.json with _class_name ParcaeConfig){hint}"
            )
        recorded = {k: meta[k] for k in ("early_exit_threshold", "special_tokens") if k in meta}
        record = {"source": {**_source(src, args.src), "format": meta["format"], "dtype": meta["dtype"], **recorded}}
        written = hf.write_model(args.out, config, state, record, tokenizer_dir=tokenizer_dir, fit_settings=True)
    n = sum(v.numel() for k, v in state.items() if k != "lm_head.weight" or not config.tie_embeddings)
    print(
        f"wrote {written}: {meta['format']} as loopnet, {n:,} parameters ({meta['dtype']}), "
        f"P={config.n_prelude} K={config.n_blocks} C={config.n_coda}, R={config.n_rounds} by default"
    )
    if not meta.get("special_tokens", {}).get("agree", True):
        print(
            f"note: the source's files name different bos/eos/pad ids ({json.dumps(meta['special_tokens']['files'])}); "
            f"loopnet ends a document with the eos_token of tokenizer_config.json"
        )


def retrofit_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="loopnet retrofit",
        description=(
            "Make a pretrained GPT-2 or Llama-family model (a transformers folder: config.json with model_type gpt2 "
            "or llama, safetensors weights) a looped model by layer selection: the first P layers become the prelude, "
            "the last C the coda, the K layers before the coda the core (the retrofitting-recurrence recipe); the "
            "adapter starts as "
            "[0 | I], so that at R = 1 with no dropped layers the model computes what the original does. "
            "Example: loopnet retrofit hf://openai-community/gpt2@<commit> models/gpt2-2-4-2 "
            "--prelude 2 --core 4 --coda 2"
        ),
    )
    parser.add_argument("src", help="a local GPT-2 or Llama folder, or hf://org/name[@revision]")
    parser.add_argument("out", help="the folder to write (must not exist, or be empty)")
    parser.add_argument("--prelude", type=int, default=None, help="P, layers before the loop (default: a sixth)")
    parser.add_argument("--core", type=int, default=None, help="K, layers in the loop (default: a third)")
    parser.add_argument("--coda", type=int, default=None, help="C, layers after the loop (default: a sixth)")
    parser.add_argument("--rounds", type=int, default=4, help="R, the mean rounds the model trains with (default 4)")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="every layer in the loop at R = 1, without injection: the original model exactly",
    )
    args = parser.parse_args(argv)
    from loopnet.formats import hf, retrofit, source

    with one_line_errors("loopnet retrofit", (ValueError, FileNotFoundError)):
        hf.check_destination(Path(args.out))
        src = source.resolve(args.src)
        config, state, split = retrofit.retrofit(
            src, prelude=args.prelude, core=args.core, coda=args.coda, rounds=args.rounds, plain=args.plain
        )
        family = source.read_json(src, "config.json").get("model_type")
        record = {"source": {**_source(src, args.src), "format": family, "layers": split}}
        written = hf.write_model(args.out, config, state, record, tokenizer_dir=src, fit_settings=True)
    print(
        f"wrote {written}: prelude layers {split['prelude']}, core {split['core']} (R={config.n_rounds}), "
        f"coda {split['coda']}"
    )


def parser() -> argparse.ArgumentParser:
    from loopnet.formats.hf import DTYPES, MAX_SHARD_SIZE

    p = argparse.ArgumentParser(
        prog="loopnet export",
        description="a checkpoint's model in the Hugging Face layout (loopnet.formats.hf)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("ckpt", help="a loopnet checkpoint: a .ckpt file, or a sharded (FSDP) checkpoint folder")
    p.add_argument("out", help="the folder to write (new or empty, unless --overwrite)")
    p.add_argument("--dtype", default="float32", help=f"the weights' dtype: {', '.join(DTYPES)} (default float32)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists and is not empty")
    p.add_argument(
        "--max_shard_size",
        default=MAX_SHARD_SIZE,
        help=f"largest safetensors file before the weights are sharded (default {MAX_SHARD_SIZE})",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    from loopnet.formats import hf

    args = parser().parse_args(argv)
    with one_line_errors("loopnet export", (ValueError, FileNotFoundError)):
        out = hf.export(
            args.ckpt, args.out, dtype=args.dtype, overwrite=args.overwrite, max_shard_size=args.max_shard_size
        )
    print(f"exported {args.ckpt} to {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")
