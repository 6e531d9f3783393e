"""The folder `loopnet import` and `loopnet retrofit` write: a loopnet model as config + safetensors,
with the source's tokenizer beside it.

    config.json         {"format": "loopnet", "config": LoopConfig's fields, "source": where it came from}
    model.safetensors   the state dict (a tied head is stored once, as wte.weight)
    tokenizer.json ...  the source's tokenizer files, when it has them
    model.yaml          the `model:` section that makes `loopnet fit` start from this folder
                        (`--config OUT/model.yaml`): init_weights and every LoopConfig field

`write_folder` and `read_folder` are the one place that knows this layout, so that it can follow
loopnet's own export layout (`loopnet.formats.hf`) when that exists."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import torch

from loopnet.model.config import LoopConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def check_out(out: Path) -> None:
    """Refuse, before any work, an OUT that already holds files (nothing written is ever replaced)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not empty; fix: give a new folder (nothing is overwritten)")


def write_folder(
    out: str | Path, config: LoopConfig, state: dict[str, torch.Tensor], source: dict, tokenizer_dir: Path | None = None
) -> Path:
    """Write the folder at `out` (written beside it under a temporary name, then renamed: an interrupted
    write leaves no half folder at `out`)."""
    from safetensors.torch import save_file

    out = Path(out)
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tensors = {k: v.contiguous() for k, v in state.items() if not (config.tie_embeddings and k == "lm_head.weight")}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        meta = {"format": "loopnet", "config": dataclasses.asdict(config), "source": source}
        (tmp / "config.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        (tmp / "model.yaml").write_text(model_yaml(out, config))
        for name in TOKENIZER_FILES:
            if tokenizer_dir is not None and (tokenizer_dir / name).is_file():
                shutil.copyfile(tokenizer_dir / name, tmp / name)
        if out.exists():
            out.rmdir()  # empty (check_out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def model_yaml(out: Path, config: LoopConfig) -> str:
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


def read_folder(folder: str | Path) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """(LoopConfig, state dict, source) of a folder `write_folder` wrote."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / "config.json").read_text())
    if meta.get("format") != "loopnet":
        raise ValueError(f"{folder}: config.json is not a loopnet folder's; fix: import it first with `loopnet import`")
    config = LoopConfig(**meta["config"])
    state = load_file(folder / "model.safetensors")
    if config.tie_embeddings:
        state["lm_head.weight"] = state["wte.weight"]
    return config, state, meta.get("source", {})


def load_model(folder: str | Path, dtype: torch.dtype | None = None):
    """A `LoopedTransformer` with the folder's weights, in eval mode (`checkpoints.build_network`: built on the
    meta device and given the memory-mapped tensors, in their stored dtype or converted to `dtype`), so that
    no second copy of the weights is made (a 3.5 B model in bf16 holds its 7 GB once)."""
    from loopnet.checkpoints import build_network

    config, state, _ = read_folder(folder)
    return build_network(config, state, dtype=dtype)


def load_weights(model, folder: str | Path) -> None:
    """Copy the folder's weights into `model` (a `LoopedTransformer`), whose architecture must equal the
    folder's (else one line naming the fields that differ); run settings (rounds drawn, backprop depth...)
    may differ."""
    config, state, _ = read_folder(folder)
    theirs = config.architecture()
    diff = [
        f"{k}: folder {theirs[k]!r} vs config {v!r}" for k, v in model.config.architecture().items() if theirs[k] != v
    ]
    if diff:
        raise ValueError(
            f"model.init_weights {folder} holds another architecture ({'; '.join(diff)}); fix: set "
            f'model.config to the "config" fields of {Path(folder) / "config.json"}'
        )
    with torch.no_grad():
        model.load_state_dict(state)
