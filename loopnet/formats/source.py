"""Reading a checkpoint folder that another library wrote: where it comes from (a local folder, or
`hf://org/name[@revision]` through `huggingface_hub`), its safetensors weights (one file, or shards
named by `model.safetensors.index.json`), and the strict renaming of its keys into loopnet's.

The folder's files are read lazily: `read_weights` returns tensors that `safetensors` reads from
the memory-mapped files, each once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

HF_SCHEME = "hf://"
INDEX = "model.safetensors.index.json"
# What an import downloads: the weights, their index, the config and the tokenizer; never remote code. Parcae's
# weights are a plain torch state dict under one of two names.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "pytorch_model.bin", "model.pt"]


class ImportFormatError(ValueError):
    """A folder that is not the format it is read as, or whose weights do not match its config."""


def parse_hf(src: str) -> tuple[str, str | None]:
    """`hf://org/name[@revision]` -> (repo id, revision or None)."""
    repo, _, revision = src[len(HF_SCHEME) :].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ImportFormatError(
            f"{src!r} is not hf://org/name[@revision]; fix: give e.g. hf://tomg-group-umd/huginn-0125@<commit>"
        )
    return repo, revision or None


def resolve(src: str) -> Path:
    """The local folder of `src`: a folder as it is, or `hf://org/name[@revision]` downloaded into the
    Hugging Face cache (only the weights, config and tokenizer files: `ALLOW_PATTERNS`). Fails in one line
    without network or with HF_HUB_OFFLINE=1 unless the cache holds the snapshot."""
    if not src.startswith(HF_SCHEME):
        folder = Path(src)
        if not folder.is_dir():
            raise FileNotFoundError(f"{src}: no such folder; fix: give a checkpoint folder or hf://org/name[@revision]")
        return folder
    repo, revision = parse_hf(src)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
    )

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=ALLOW_PATTERNS))
    except HfHubHTTPError as err:  # the hub answered: no such repository or revision, or a gated one
        raise ImportFormatError(
            f"{src}: the hub refused it ({str(err).splitlines()[0]}); fix: check the repository "
            f"name and revision, and log in (`huggingface-cli login`) for a gated model"
        ) from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        why = "HF_HUB_OFFLINE is set" if offline else f"the hub is unreachable ({type(err).__name__})"
        raise ImportFormatError(
            f"{src}: not in the Hugging Face cache and {why}; fix: run with network and HF_HUB_OFFLINE unset, or "
            f"download it elsewhere (`huggingface-cli download {repo}"
            f"{' --revision ' + revision if revision else ''} --local-dir DIR`) and give DIR"
        ) from None


def read_json(folder: Path, name: str) -> dict:
    path = folder / name
    if not path.is_file():
        raise ImportFormatError(f"{folder}: no {name}; fix: give the model's folder as the hub serves it")
    return json.loads(path.read_text())


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors weights by name: the files `model.safetensors.index.json`
    names, else `model.safetensors`. Tensors keep their stored dtype."""
    from safetensors import safe_open

    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / "model.safetensors").is_file():
        weight_map, files = None, ["model.safetensors"]
    else:
        raise ImportFormatError(
            f"{folder}: neither {INDEX} nor model.safetensors; fix: give a folder with the "
            f"model's safetensors weights (a PyTorch .bin checkpoint is not read)"
        )
    tensors = {}
    for name in files:
        if not (folder / name).is_file():
            raise ImportFormatError(f"{folder}: {INDEX} names {name}, which is missing; fix: download it again")
        with safe_open(folder / name, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is no dict)
                tensors[key] = f.get_tensor(key)
    if weight_map is not None and set(weight_map) != set(tensors):
        missing = sorted(set(weight_map) - set(tensors))
        raise ImportFormatError(
            f"{folder}: {INDEX} names tensors its files lack: {', '.join(missing[:5])}; fix: download the weights again"
        )
    return tensors


def check_keys(source: str, unused: set[str], expected: set[str], produced: set[str]) -> None:
    """Refuse, in one line, a mapping that left source tensors unused or loopnet weights unfilled."""
    missing = sorted(expected - produced)
    unexpected = sorted(unused)
    extra = sorted(produced - expected)
    if missing or unexpected or extra:
        parts = []
        if unexpected:
            parts.append(f"unexpected tensors {', '.join(unexpected[:6])}{' ...' if len(unexpected) > 6 else ''}")
        if missing:
            parts.append(f"missing tensors for {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
        if extra:
            parts.append(f"tensors loopnet's model lacks: {', '.join(extra[:6])}")
        raise ImportFormatError(
            f"{source}: the weights do not match the config ({'; '.join(parts)}); fix: give an "
            f"unmodified checkpoint folder whose config.json describes its weights"
        )


def expected_keys(config) -> dict[str, torch.Size]:
    """The state-dict keys and shapes of a `LoopedTransformer(config)`, from a model built on the meta device."""
    from loopnet.model.transformer import LoopedTransformer

    with torch.device("meta"):
        model = LoopedTransformer(config)
    return {k: v.shape for k, v in model.state_dict().items()}


def check_shapes(source: str, state: dict[str, torch.Tensor], shapes: dict[str, torch.Size]) -> None:
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(shapes[k])}" for k, v in state.items() if v.shape != shapes[k]]
    if wrong:
        raise ImportFormatError(
            f"{source}: tensor shapes differ from what config.json implies "
            f"({'; '.join(wrong[:4])}); "
            f"fix: give the config.json that belongs to these weights"
        )
