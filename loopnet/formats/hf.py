"""loopnet's model folder, in the Hugging Face layout: `write_model` is its one writer (`loopnet export CKPT OUT`
writes a checkpoint's model through it, `loopnet import` and `loopnet retrofit` another library's model) and
`read_exported` its one reader (memory-mapped, never unpickled).

    OUT/
      model.safetensors                 weights (model-0000i-of-0000n.safetensors + model.safetensors.index.json
                                        past `max_shard_size`), keys of `LoopnetForCausalLM`: "model." + loopnet's
      config.json                       model_type loopnet, auto_map, every LoopConfig field, dtype, loopnet_vocab,
                                        loopnet_export: where the weights came from (below)
      generation_config.json
      configuration_loopnet.py          the transformers config (`loopnet.formats.configuration_loopnet`)
      modeling_loopnet.py               loopnet.model's modules in one file, and the transformers wrapper
      tokenizer.json, tokenizer_config.json, ...   GPT-2's BPE or the byte vocabulary (export); the source's own
                                        files, copied (import, retrofit: loopnet_vocab "tokenizer")
      README.md                         the model card
      model.yaml                        import and retrofit only: the `model:` settings of a fit that starts
                                        from the folder (`--config OUT/model.yaml`)

config.json's `loopnet_export` is the one record of provenance: "parameters", and from a checkpoint (export)
"checkpoint", "global_step", "epoch", "data"; from another library's folder (import, retrofit) "source": "src"
(the argument), "commit" (an hf:// source's resolved commit), "format" and what the importer read ("dtype",
"layers", "special_tokens", ...). `read_exported` returns it as the metadata.

A folder that `loopnet import` or `retrofit` wrote in the layout they used before this one (config.json
{"format": "loopnet", "config": LoopConfig's fields, "source": ...}, loopnet's keys unprefixed) is still read
(`read_legacy`): its weights, config and source as written.

Light to import: torch, safetensors and transformers load inside the functions that use them; reading a
model folder needs no transformers.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MODEL_TYPE = "loopnet"
ARCHITECTURE = "LoopnetForCausalLM"
PREFIX = "model."  # the wrapper keeps the LoopedTransformer under `model`: its keys in the safetensors files
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHIPPED = ("configuration_loopnet", "modeling_loopnet")  # the code files written beside the weights
DTYPES = ("float32", "bfloat16", "float16")
MAX_SHARD_SIZE = "5GB"  # save_pretrained's default
EXPORT_KEY = "loopnet_export"  # config.json's record of where the weights came from
# The files of a source's tokenizer that an import copies (its generation_config.json replaces the default one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
LEGACY_FORMAT = "loopnet"  # config.json's "format" in the layout import and retrofit wrote before this one
WRITERS = "loopnet export, import or retrofit"


class ExportError(ValueError):
    """What writing a model folder (`loopnet export`, `import`, `retrofit`) refuses, said in one line."""


# ----------------------------------------------------------------------------------------- reading
def read_exported(folder: str | Path) -> tuple[Any, dict, dict]:
    """(LoopConfig, the `LoopedTransformer`'s state dict, metadata) of a model folder (the module docstring).

    The state dict has the keys of `LoopedTransformer.state_dict()` (with a tied head, `lm_head.weight` is
    the embedding's tensor); its tensors are memory-mapped from the safetensors files, in the dtype they
    were written in. Nothing is unpickled. Metadata: "vocab" (the tokenizer: the `data.vocab` the model was
    trained on, or "tokenizer", the folder's own tokenizer.json), "dtype", and config.json's `loopnet_export`
    record ("global_step", "checkpoint", ... of an export; "source" of an import)."""
    from safetensors.torch import load_file

    from loopnet.model.config import LoopConfig

    folder = Path(folder)
    config = read_config(folder)
    if config.get("format") == LEGACY_FORMAT:
        return read_legacy(folder, config)
    names = [f.name for f in dataclasses.fields(LoopConfig)]
    loop_config = LoopConfig(**{k: config[k] for k in names if k in config})
    state: dict = {}
    for file in weight_files(folder):
        for key, tensor in load_file(folder / file).items():  # safetensors memory-maps the file
            if not key.startswith(PREFIX):
                raise ValueError(
                    f"{folder / file} holds {key!r}, not a loopnet weight ({PREFIX}...); "
                    f"fix: give a folder written by {WRITERS}"
                )
            state[key.removeprefix(PREFIX)] = tensor
    if loop_config.tie_embeddings and "wte.weight" in state:
        state.setdefault("lm_head.weight", state["wte.weight"])  # stored once
    meta = dict(config.get(EXPORT_KEY) or {})
    meta.update(vocab=config.get("loopnet_vocab", "gpt2"), dtype=config.get("dtype", "float32"))
    return loop_config, state, meta


def read_legacy(folder: Path, config: dict) -> tuple[Any, dict, dict]:
    """`read_exported` of a folder in the layout `loopnet import` and `retrofit` wrote before this one: config.json
    {"format": "loopnet", "config": LoopConfig's fields, "source": ...}, one model.safetensors with loopnet's own
    keys (a tied head stored once, as wte.weight), the source's tokenizer files. Metadata: "source", "vocab"
    ("tokenizer") and "dtype"."""
    from safetensors.torch import load_file

    from loopnet.model.config import LoopConfig

    loop_config = LoopConfig(**config["config"])
    (file,) = weight_files(folder)
    state = load_file(folder / file)
    if loop_config.tie_embeddings and "wte.weight" in state:
        state.setdefault("lm_head.weight", state["wte.weight"])
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.") if state else "float32"
    return loop_config, state, {"source": config.get("source") or {}, "vocab": "tokenizer", "dtype": dtype}


def read_config(folder: Path) -> dict:
    """config.json of a model folder: model_type loopnet, or the earlier import layout's format loopnet."""
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(
            f"{folder} holds no config.json, so it is not a loopnet model folder; fix: give a folder "
            f"written by {WRITERS}"
        )
    config = json.loads(path.read_text())
    if config.get("model_type") != MODEL_TYPE and config.get("format") != LEGACY_FORMAT:
        raise ValueError(
            f"{path} is of model_type {config.get('model_type')!r}, not {MODEL_TYPE!r}; fix: give a "
            f"folder written by {WRITERS} (another library's model: `loopnet import` it first)"
        )
    return config


def weight_files(folder: Path) -> list[str]:
    """The safetensors files of a model folder: the index's, else model.safetensors."""
    if (folder / INDEX).is_file():
        return sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    if (folder / WEIGHTS).is_file():
        return [WEIGHTS]
    raise ValueError(f"{folder} holds neither {WEIGHTS} nor {INDEX}; fix: write the folder again with {WRITERS}")


# ----------------------------------------------------------------------------------------- the checkpoint
def checkpoint_contents(path: str | Path) -> tuple[dict, dict, dict]:
    """(model config, the LoopedTransformer's weights, the checkpoint's other entries) of a loopnet
    checkpoint: a `.ckpt` file, or a sharded (FSDP) checkpoint folder, whose weights are gathered from its
    shards with torch.distributed.checkpoint (no process group needed)."""
    from loopnet.checkpoints import (
        check_checkpoint_file,
        is_sharded_checkpoint,
        load_checkpoint_meta,
        model_weights,
    )

    path = Path(path)
    try:
        check_checkpoint_file(str(path), option="CKPT")
    except (ValueError, FileNotFoundError) as err:
        raise ExportError(str(err).replace(" or 'last'", "")) from None  # `last` is fit's, not export's
    ckpt = load_checkpoint_meta(str(path))  # restricted unpickler; one line for a corrupt or foreign file
    vocab = (ckpt.get("datamodule_hyper_parameters") or {}).get("vocab", "gpt2")
    if vocab not in ("gpt2", "bytes"):
        raise ExportError(
            f"{path} was trained with data.vocab: {vocab} (ids of its own corpus, which no tokenizer "
            f"file describes); fix: export a model trained with data.vocab: gpt2 or bytes"
        )
    if not is_sharded_checkpoint(path):
        config, weights = model_weights({**ckpt, "datamodule_hyper_parameters": None}, path)
        return config, weights, ckpt
    config = (ckpt.get("hyper_parameters") or {}).get("config")
    if config is None:
        raise ExportError(
            f"{path} is not a loopnet checkpoint (its meta.pt has no hyper_parameters.config, as "
            f"loopnet fit saves); fix: give a checkpoint written by loopnet fit"
        )
    return config, sharded_model_weights(path), ckpt


def sharded_model_weights(folder: Path) -> dict:
    """The LoopedTransformer's whole tensors from a sharded checkpoint folder (Lightning's FSDP layout: the
    LightningModule's state dict under "model", so loopnet's network under "model.model.")."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    wanted = [k for k in FileSystemReader(folder).read_metadata().state_dict_metadata if k.startswith("model.model.")]
    state: dict = {}
    _load_state_dict(
        state, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(keys=wanted), no_dist=True
    )
    flat: dict = {}

    def walk(prefix: str, value) -> None:  # the planner nests the loaded keys by their dots
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        else:
            flat[prefix[:-1]] = value

    walk("", state)
    return {k.removeprefix("model.model."): v for k, v in flat.items() if k.startswith("model.model.")}


# ----------------------------------------------------------------------------------------- export
def check_destination(out: Path, overwrite: bool | None = None) -> None:
    """Refuse, before any work, an `out` that is a file or a folder holding files: nothing written is replaced,
    unless `overwrite` (export's --overwrite; None: the command has no such option)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is a file; fix: give a folder path to write the model into")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        fix = ", or pass --overwrite to replace it" if overwrite is False else " (nothing is overwritten)"
        raise ExportError(f"{out} already exists and is not empty; fix: give a new folder{fix}")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype} is not supported; fix: give one of {', '.join(DTYPES)}")


def export(
    ckpt_path: str | Path,
    out: str | Path,
    dtype: str = "float32",
    overwrite: bool = False,
    max_shard_size: int | str = MAX_SHARD_SIZE,
) -> Path:
    """Write the model of loopnet checkpoint `ckpt_path` into folder `out` (`write_model`), its weights in
    `dtype`, its tokenizer the run's `data.vocab`."""
    import torch

    from loopnet.checkpoints import build_network

    out = Path(out)
    check_dtype(dtype)
    check_destination(out, overwrite)
    if importlib.util.find_spec("transformers") is None:  # the tokenizer files are written through it
        raise ExportError("loopnet export needs transformers, which is not installed; fix: pip install -e '.[hf]'")
    config, weights, ckpt = checkpoint_contents(ckpt_path)
    model = build_network(config, weights)  # checks the weights against the config (and reads older layouts)
    cfg, target = model.config, getattr(torch, dtype)
    state = {
        k: v.detach().to(target)
        for k, v in model.state_dict().items()
        if not (cfg.tie_embeddings and k == "lm_head.weight")
    }
    vocab = (ckpt.get("datamodule_hyper_parameters") or {}).get("vocab", "gpt2")
    record, summary = export_record(ckpt, Path(ckpt_path)), run_summary(Path(ckpt_path))
    return write_model(
        out, cfg, state, record, vocab=vocab, overwrite=overwrite, max_shard_size=max_shard_size, summary=summary
    )


def write_model(
    out: str | Path,
    config,
    state: dict,
    record: dict,
    *,
    vocab: str = "gpt2",
    tokenizer_dir: Path | None = None,
    overwrite: bool | None = None,
    max_shard_size: int | str = MAX_SHARD_SIZE,
    summary: dict | None = None,
    fit_settings: bool = False,
) -> Path:
    """Write the model folder at `out` (the module docstring), the one writer of export, import and retrofit:
    `config` (a LoopConfig) and `state` (the LoopedTransformer's state dict, in the dtype to store; a tied head
    is stored once), `record` as config.json's `loopnet_export` (the parameter count added), the tokenizer of
    `vocab` ("gpt2" or "bytes", built) or, with `tokenizer_dir`, that folder's own files (`TOKENIZER_FILES`,
    copied; the vocabulary is then "tokenizer"), `summary` the run's summary.json for the model card, and with
    `fit_settings` model.yaml. A non-empty `out` is refused unless `overwrite` (`check_destination`). The folder is written
    into a temporary sibling and renamed into place at the end: a failure or a kill leaves `out` as it was
    (absent, empty, or the previous folder)."""
    out = Path(out)
    check_destination(out, overwrite)
    vocab = "tokenizer" if tokenizer_dir is not None else vocab
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.write-", dir=out.parent))
    try:
        fill_folder(work, out, config, state, record, vocab, tokenizer_dir, max_shard_size, summary or {}, fit_settings)
        if out.exists():  # empty, or --overwrite: the old folder goes only once the new one is complete
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "old")
            os.replace(work, out)
            shutil.rmtree(old)
        else:
            os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def fill_folder(
    folder: Path,
    out: Path,
    cfg,
    state: dict,
    record: dict,
    vocab: str,
    tokenizer_dir: Path | None,
    max_shard_size: int | str,
    summary: dict,
    fit_settings: bool,
) -> None:
    """The files of `write_model`, written into `folder` (renamed to `out` once complete)."""
    stored = {
        PREFIX + k: v.contiguous() for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")
    }
    write_weights(folder, stored, max_shard_size)
    dtype = str(state["wte.weight"].dtype).removeprefix("torch.")
    record = {**record, "parameters": sum(v.numel() for v in stored.values())}
    write_json(folder / "config.json", hf_config(cfg, vocab, dtype, record))
    ids = eot_ids(vocab, cfg.vocab_size)
    pad = {"pad_token_id": ids["eos_token_id"]} if ids else {}
    write_json(folder / "generation_config.json", {**ids, **pad, "do_sample": False})
    for name in SHIPPED:
        (folder / f"{name}.py").write_text(shipped_source(name))
    if tokenizer_dir is None:
        write_tokenizer(folder, vocab, cfg.seq_len)
    else:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copyfile(tokenizer_dir / name, folder / name)
    (folder / "README.md").write_text(model_card(cfg, vocab, dtype, record, summary))
    if fit_settings:
        (folder / "model.yaml").write_text(model_yaml(out, cfg))


def write_weights(folder: Path, state: dict, max_shard_size: int | str) -> None:
    """Shards as `save_pretrained` writes them (huggingface_hub's split, an index past one file)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(
        state, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size
    )
    for file, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in keys}, folder / file, metadata={"format": "pt"})
    if split.is_sharded:
        write_json(folder / INDEX, {"metadata": split.metadata, "weight_map": split.tensor_to_filename})


def export_record(ckpt: dict, source: Path) -> dict:
    """What config.json records of the checkpoint (read_exported returns it)."""
    data = ckpt.get("datamodule_hyper_parameters") or {}
    return {
        "checkpoint": source.name,
        "global_step": ckpt.get("global_step"),
        "epoch": ckpt.get("epoch"),
        "data": {k: data.get(k) for k in ("source", "path", "name", "vocab", "seq_len") if k in data},
    }


def eot_ids(vocab: str, vocab_size: int) -> dict:
    """bos_token_id and eos_token_id: the end-of-text id of a vocabulary loopnet trains with, when the embedding
    holds it ({} for a folder's own tokenizer: its files name them)."""
    from loopnet.data.token_ids import EOT_ID

    eot = {"gpt2": EOT_ID, "bytes": 256}.get(vocab)
    return {"bos_token_id": eot, "eos_token_id": eot} if eot is not None and eot < vocab_size else {}


def hf_config(cfg, vocab: str, dtype: str, meta: dict) -> dict:
    from loopnet.data.vocabulary import known_size

    n_vocab = known_size(vocab)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "auto_map": {
            "AutoConfig": "configuration_loopnet.LoopnetConfig",
            "AutoModelForCausalLM": "modeling_loopnet.LoopnetForCausalLM",
        },
        **dataclasses.asdict(cfg),
        "loopnet_vocab": vocab,
        # the real ids: the logits' width, as loopnet's (None, a folder's own tokenizer: every id)
        "loopnet_n_vocab": None if n_vocab is None else min(n_vocab, cfg.vocab_size),
        "tie_word_embeddings": cfg.tie_embeddings,
        # the usual names, for tools that read them (lm-eval's window: max_position_embeddings)
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "max_position_embeddings": cfg.seq_len,
        **eot_ids(vocab, cfg.vocab_size),
        "dtype": dtype,
        EXPORT_KEY: meta,
    }


def model_yaml(out: Path, config) -> str:
    """The model settings of a fit that starts from the folder `out`: its weights and its architecture (and the
    source's own run settings: rounds drawn, backprop depth), as YAML with dotted keys, which set each value
    and leave the rest of `model` (optim, eval_rounds...) to the configs given before it."""
    import yaml

    values = {
        "model.init_weights": str(out.resolve()),
        **{f"model.config.{k}": v for k, v in dataclasses.asdict(config).items()},
    }
    return (
        "# loopnet fit --config configs/base.yaml --config <this file> [--data.vocab tokenizer --data.tokenizer "
        "<this folder>]\n" + yaml.safe_dump(values, sort_keys=False)
    )


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, default=str) + "\n")


# ----------------------------------------------------------------------------------------- tokenizer
def write_tokenizer(folder: Path, vocab: str, seq_len: int) -> None:
    """GPT-2's BPE (the files `loopnet.data.tokenizer` builds its Encoding from), or, for the byte vocabulary,
    a byte-level BPE without merges: each UTF-8 byte b is id b, <|endoftext|> is 256."""
    from transformers import GPT2TokenizerFast, PreTrainedTokenizerFast

    from loopnet.data.tokenizer import _check_files, _default_data_dir
    from loopnet.data.token_ids import EOT_TEXT

    if vocab == "gpt2":
        files = _check_files(_default_data_dir())  # the digests tiktoken checks
        tokenizer = GPT2TokenizerFast(vocab=files["encoder.json"], merges=files["vocab.bpe"], model_max_length=seq_len)
    else:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        chars = bytes_to_unicode()  # byte -> the printable character byte-level BPE spells it with
        table = {chars[b]: b for b in range(256)} | {EOT_TEXT: 256}
        core = Tokenizer(models.BPE(vocab=table, merges=[]))
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        core.decoder = decoders.ByteLevel()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=core, eos_token=EOT_TEXT, bos_token=EOT_TEXT, unk_token=EOT_TEXT, model_max_length=seq_len
        )
    tokenizer.save_pretrained(folder)


# ----------------------------------------------------------------------------------------- model card
def run_summary(source: Path) -> dict:
    """The run's summary.json (`<version>/checkpoints/<ckpt>` → `<version>/summary.json`), or {}."""
    try:
        return json.loads((source.resolve().parent.parent / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def model_card(cfg, vocab: str, dtype: str, meta: dict, summary: dict) -> str:
    """README.md: what the folder holds and how to open it; for an imported model, where it came from."""
    from loopnet.model.scales import scheme_label

    data = meta.get("data") or {}
    corpus = data.get("name") or data.get("path") or data.get("source") or (summary.get("data") or {}).get("source")
    loss = summary.get("best_val_loss", summary.get("final_val_loss"))
    depth = f"P={cfg.n_prelude} + K={cfg.n_blocks}·R={cfg.n_rounds} + C={cfg.n_coda}"
    rows = [
        ("blocks × rounds", f"{depth} (N = {cfg.n_unrolled} block visits)"),
        ("width, heads", f"d={cfg.d_model}, {cfg.n_heads} heads, FFN ×{cfg.mlp_ratio:g}"),
        ("residual scheme", scheme_label(cfg.residual, cfg.p)),
        ("wiring", cfg.wiring),
        ("positions, norm", f"{cfg.positions}, {cfg.norm}"),
        ("parameters", f"{meta.get('parameters'):,}"),
        ("vocabulary", f"{vocab} ({cfg.vocab_size} ids)"),
        ("context", f"{cfg.seq_len} tokens"),
    ]
    source = meta.get("source")
    if source is None:
        title = "A looped Transformer trained with loopnet"
        origin = f"exported from `{meta.get('checkpoint')}`."
        rows += [
            ("trained on", corpus or "not recorded"),
            ("steps", meta.get("global_step")),
            ("validation loss", "not recorded" if loss is None else f"{loss:.4f} (nats per token at R={cfg.n_rounds})"),
        ]
    else:
        title = "A looped Transformer in loopnet's layout"
        at = f" at commit {source['commit']}" if source.get("commit") else ""
        origin = (
            f"{source.get('format')} read from `{source.get('src')}`{at} by loopnet. The weights are the source's: "
            f"its license and model card apply."
        )
    rows.append(("weights", f"{dtype} safetensors"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [loopnet, looped-transformer]
---

# {title}

{cfg.n_blocks} physical blocks applied for {cfg.n_rounds} rounds, {origin}

| | |
|---|---|
{table}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(FOLDER, trust_remote_code=True)  # transformers 5 reads config.json first
model = AutoModelForCausalLM.from_pretrained(FOLDER, trust_remote_code=True)
ids = tokenizer("ROMEO:", return_tensors="pt").input_ids
model(ids).logits                                   # at the training R = {cfg.n_rounds}
model.generate(ids, max_new_tokens=32, rounds=2 * {cfg.n_rounds})  # any R' (KV cache per round and block)
```

`trust_remote_code=True` runs `modeling_loopnet.py` and `configuration_loopnet.py` from this folder: loopnet's
own model code (torch and transformers only). With loopnet installed, `loopnet.load(FOLDER)` opens it too.
"""


# ----------------------------------------------------------------------------------------- the code files
def shipped_source(name: str) -> str:
    """The text of the shipped file `name`: the config verbatim, the model with loopnet.model inlined."""
    if name == "modeling_loopnet":
        return modeling_source()
    return Path(module_file(f"loopnet.formats.{name}")).read_text()


def module_file(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    return spec.origin


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.rsplit(".", node.level)[0]
    return f"{package}.{node.module}" if node.module else package


def _package_names(package: str) -> dict[str, str]:
    """A lazy package's names -> the submodule that defines them (`loopnet.model`'s `_WHERE`)."""
    import importlib

    where = getattr(importlib.import_module(package), "_WHERE", {})
    return {name: package + sub for name, sub in where.items()}


def modeling_source() -> str:
    """modeling_loopnet.py as exported: every loopnet module `loopnet.formats.modeling_loopnet` reads (at any
    depth) inlined into one file, their loopnet imports removed: a module's top-level imports above it, those
    made inside its functions (read only when called) after it. The shipped config file's relative import
    stays. One name defined by two of those modules would make them share it: refused."""
    order: list[str] = []
    edits: dict[str, list[tuple[int, int, str]]] = {}
    owner: dict[str, tuple[str, str]] = {}  # a top-level name -> (module, what defines it)
    keep = {f"loopnet.formats.{name}" for name in SHIPPED}

    def visit(module: str) -> None:
        if module in order or module in edits:
            return
        edits[module] = []
        tree = ast.parse(Path(module_file(module)).read_text())
        top = {id(node) for node in tree.body}
        deps: list[str] = []  # imported at the top: defined above this module
        later: list[str] = []  # imported inside a function (read when called): may follow it
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "loopnet" for a in node.names):
                raise ValueError(
                    f"{module}: `import loopnet...` cannot be inlined; fix: import names with `from ... import`"
                )
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(module, node)
            if node.module == "__future__":
                edits[module].append((node.lineno, node.end_lineno, ""))
                continue
            if source.split(".")[0] != "loopnet" or source in keep:
                continue
            targets = _package_names(source) if source == "loopnet.model" else {}
            aliases = []
            for alias in node.names:
                (deps if id(node) in top else later).append(targets.get(alias.name, source))
                if alias.asname and alias.asname != alias.name:
                    aliases.append(f"{alias.asname} = {alias.name}")
            edits[module].append((node.lineno, node.end_lineno, "; ".join(aliases) or "pass"))
        for dep in deps:
            visit(dep)
        for node in tree.body:  # what this module defines at top level (after its dependencies: their names first)
            for name, what in _defined(node):
                if name in owner and owner[name][1] != what:
                    raise ValueError(
                        f"{module} and {owner[name][0]} both define {name!r}: inlined into one file they "
                        f"would clash; fix: rename one of them"
                    )
                owner.setdefault(name, (module, what))
        order.append(module)
        for dep in later:
            visit(dep)

    visit("loopnet.formats.modeling_loopnet")
    parts, digests = [], []
    for module in order:
        path = Path(module_file(module))
        lines = path.read_text().splitlines()
        for start, end, text in sorted(edits[module], reverse=True):
            indent = lines[start - 1][: len(lines[start - 1]) - len(lines[start - 1].lstrip())]
            lines[start - 1 : end] = [indent + text] if text else []
        relative = module.replace(".", "/") + ".py"
        digests.append(f"#   {relative}  sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}")
        parts.append(f"# {'-' * 40} {relative}\n" + "\n".join(lines).strip("\n") + "\n")
    header = (
        '"""A loopnet model for transformers (trust_remote_code): loopnet\'s model modules inlined into one\n'
        "file by `loopnet export`, followed by the transformers wrapper.\n"
        'Generated: edit loopnet, not this file."""\n'
        "# Inlined from:\n" + "\n".join(digests) + "\n\nfrom __future__ import annotations\n\n"
    )
    source = header + "\n\n".join(parts)
    compile(source, "modeling_loopnet.py", "exec")
    return source


def _defined(node: ast.stmt) -> list[tuple[str, str]]:
    """(name, what defines it) for a top-level statement: a def or class is its module's own; an import is
    the same object wherever it is written."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, f"def@{id(node)}")]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [(n.id, f"assign@{id(node)}") for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.Import):
        return [((a.asname or a.name).split(".")[0], f"import {a.name}") for a in node.names]
    if (
        isinstance(node, ast.ImportFrom)
        and node.module != "__future__"
        and not node.level
        and (node.module or "").split(".")[0] != "loopnet"
    ):
        return [(a.asname or a.name, f"from {node.module} import {a.name}") for a in node.names]
    return []
