"""loopnet's Python API: open a trained looped Transformer in a few lines, generate text at any R′, and read
its per-visit and per-round quantities for a text. Documented with runnable examples in docs/python.md.

    model = loopnet.load("runs/<run name>")          # a .ckpt, a run or version folder, a model folder
    model.generate("ROMEO:", 40, rounds=12, exit="kl").text
    print(model.visits("To be, or not to be"))       # one row per visit (round r, block k, sublayer)
    print(model.fixed_point("To be, or not to be"))  # one row per round: loss, latent change, KL, σ_max

Each quantity comes from the code the trainer's callbacks and `loopnet test` use: generation is
`LoopedTransformer.generate`, the per-visit values are the diagnostics' `VisitProbe`, the per-round profile
is validation's `RoundProfileMeter` (`loopnet.diagnostics.fixed_point`).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from loopnet.data.vocabulary import VOCABULARIES, CompactVocab, Vocabulary
from loopnet.checkpoints import build_network
from loopnet.model import LoopConfig, LoopedTransformer

EXPORTED_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # one file, or the shards' index


@dataclass
class Completion:
    """What `Model.generate` returns for one prompt: the new text (the prompt not included), its token
    ids, and the rounds each new token ran (R′ for every token unless the exit criterion stopped it earlier)."""

    prompt: str
    text: str
    tokens: list[int]
    rounds: list[int]

    @property
    def mean_rounds(self) -> float:
        """Mean rounds per new token (nan when none was generated)."""
        return sum(self.rounds) / len(self.rounds) if self.rounds else math.nan


class Table:
    """Named columns and one dict per row: `rows`, `columns`, `column(name)`, `to_csv()`, and `print(table)`
    for an aligned text view. A value that does not apply (an FFN visit's attention logits, round 1's KL)
    is None."""

    def __init__(self, columns: Sequence[str], rows: list[dict]):
        self.columns, self.rows = list(columns), rows

    def column(self, name: str) -> list:
        """The values of column `name`, one per row."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}; the columns are {', '.join(self.columns)}")
        return [row[name] for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def to_csv(self, path: str | Path | None = None) -> str:
        """The table as CSV text (None as an empty cell), also written to `path` when given."""
        out = io.StringIO()
        writer = csv.DictWriter(out, self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        if path is not None:
            Path(path).write_text(out.getvalue(), encoding="utf-8")
        return out.getvalue()

    def __str__(self) -> str:
        def cell(value) -> str:
            if value is None:
                return "–"
            return f"{value:.4g}" if isinstance(value, float) else str(value)

        cells = [self.columns] + [[cell(row[c]) for c in self.columns] for row in self.rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(self.columns))]
        return "\n".join("  ".join(v.rjust(w) for v, w in zip(line, widths)).rstrip() for line in cells)

    __repr__ = __str__


class Model:
    """A trained `LoopedTransformer` with the tokenizer of the data it was trained on.

    Attributes:
        network: the `LoopedTransformer` (a torch module, in eval mode): `network(ids, rounds=R′)` gives
            (logits, None); `network.iter_rounds` the state after every round.
        config: its `LoopConfig` (K = `n_blocks`, R = `n_rounds`, the scheme, the wiring, ...).
        tokenizer: text <-> the token ids the model was trained on (`encode(text)`, `decode(ids)`, `size`):
            GPT-2's BPE, the corpus's compact ids or UTF-8 bytes, as the run's `data.vocab` was.
    """

    def __init__(self, network: LoopedTransformer, tokenizer: Vocabulary):
        self.network, self.tokenizer = network, tokenizer

    @property
    def config(self) -> LoopConfig:
        return self.network.config

    def __repr__(self) -> str:
        cfg, weight = self.config, self.network.wte.weight
        return (
            f"loopnet.Model({cfg.residual} {cfg.wiring}, K={cfg.n_blocks}, R={cfg.n_rounds}, d={cfg.d_model}, "
            f"vocab {self.tokenizer.name}, {weight.device.type} {str(weight.dtype).removeprefix('torch.')})"
        )

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of `text` as a [1, T] tensor on the model's device, ready for `network`."""
        return torch.tensor([self.tokenizer.encode(text)], dtype=torch.long, device=self.network.wte.weight.device)

    # ----------------------------------------------------------------------------- generate
    def generate(
        self,
        prompt: str | Sequence[str],
        max_new_tokens: int = 64,
        *,
        rounds: int | None = None,
        cache: bool = True,
        exit: str = "none",
        exit_threshold: float | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
    ) -> Completion | list[Completion]:
        """Continue `prompt` (one text, or a list of texts: a batch) by `max_new_tokens` tokens at R′ = `rounds`
        (default: the training R), greedy unless `temperature` > 0 (then sampled, from the `top_k` most
        likely). `cache`: keys and values kept per (round, block), so each new token runs over its own
        position only. `exit` ("kl", "latent", "entropy", "argmax"; `loopnet.model.exit`): each token stops
        after the first round at which the criterion holds (threshold `exit_threshold`, None: its default);
        `rounds` is then the most rounds a token runs. Returns a `Completion` (a list for a list of prompts)
        with the new text and the rounds of each token. This is `LoopedTransformer.generate`, as
        `loopnet predict` runs it, over the tokenizer's ids only."""
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        ids = [self.tokenizer.encode(text) for text in texts]
        if not texts or not all(ids):
            raise ValueError("every prompt needs at least one token; fix: give a non-empty prompt text")
        out = self.network.generate(
            ids,
            max_new_tokens,
            rounds=rounds,
            temperature=temperature,
            top_k=top_k,
            n_vocab=self.tokenizer.size,
            cache=cache,
            exit=exit,
            exit_threshold=exit_threshold,
        )
        done = [
            Completion(text, self.tokenizer.decode(new), new, used)
            for text, new, used in zip(texts, out.tokens, out.rounds, strict=True)
        ]
        return done[0] if isinstance(prompt, str) else done

    # ----------------------------------------------------------------------------- per visit
    @torch.no_grad()
    def visits(self, text: str | torch.Tensor, *, rounds: int | None = None) -> Table:
        """The forward quantities of every sublayer visit for `text` (or token ids [T] or [B, T]) at R′ =
        `rounds` (default R): one row per visit, in execution order (prelude, round 1's blocks, ...,
        coda), named as the diagnostics name it (`visit`: ``r03_k1_attn``, ``p1_attn``, ``c1_ffn``; its
        `part`, `round` r, `block` k, `sublayer`). Columns, as `loopnet.diagnostics.tags` defines them:
        `resid_norm` (RMS of the pre-Norm stream α·x + f(x)), `state_norm_dev`, `branch_ratio`
        ‖f(x)‖/‖α·x‖, and at attention visits `attn_logit_max`, `attn_logit_absmax`, `attn_log_z`.
        Measured by the `VisitProbe` the training callback attaches, over the batch's positions."""
        from loopnet.diagnostics.visit_probe import VisitProbe
        from loopnet.diagnostics.tags import ATTN_QUANTITIES, FORWARD_QUANTITIES

        idx = self._ids(text, extra=0)
        probe = VisitProbe()
        self.network.attach_observer(probe)
        try:
            self.network(idx, rounds=rounds)
        finally:
            self.network.attach_observer(None)
        rows = []
        for visit in probe.visits:
            values = probe.forward_quantities(visit) | probe.attention_quantities(visit)
            rows.append(
                {
                    "visit": visit.tag,
                    "part": visit.part,
                    "round": visit.round,
                    "block": visit.block,
                    "sublayer": visit.sublayer,
                }
                | {q: float(values[q]) if q in values else None for q in FORWARD_QUANTITIES + ATTN_QUANTITIES}
            )
        return Table(["visit", "part", "round", "block", "sublayer", *FORWARD_QUANTITIES, *ATTN_QUANTITIES], rows)

    # ----------------------------------------------------------------------------- per round
    def fixed_point(self, text: str | torch.Tensor, *, rounds: int | None = None, jacobian: bool = True) -> Table:
        """The extrapolation and fixed-point profile of `text` (or token ids [T] or [B, T]; position t
        predicts token t + 1) for rounds r = 1..`rounds` (default 2R, past the training R): one row per round
        with `loss` (cross-entropy of round r's prediction), `latent_change` ‖x_r − x_{r−1}‖/‖x_r‖, `kl`
        KL(p_{r−1} ‖ p_r) and, with `jacobian`, `sigma_max` (the largest singular value of round r's
        Jacobian: below 1 the rounds contract towards a fixed point); round 1 has no change, KL or σ_max.
        Measured as validation measures it (`RoundProfileMeter`, `model.extrapolate_rounds`)."""
        from loopnet.diagnostics.depth_eval import JACOBIAN_ITERS, JACOBIAN_SEQUENCES
        from loopnet.diagnostics.fixed_point import QUANTITIES, RoundProfileMeter

        R = 2 * self.config.n_rounds if rounds is None else rounds
        if R < 1:
            raise ValueError(f"rounds must be >= 1, got {R}; fix: give the last round to measure")
        ids = self._ids(text, extra=1)
        meter = RoundProfileMeter(R, JACOBIAN_SEQUENCES if jacobian else 0, JACOBIAN_ITERS)
        meter.update(self.network, ids[:, :-1], ids[:, 1:])
        profile = meter.compute()
        columns = [q for q in QUANTITIES if q in profile]
        return Table(
            ["round", *columns], [{"round": r} | {q: profile[q][r - 1] for q in columns} for r in range(1, R + 1)]
        )

    def _ids(self, text: str | torch.Tensor, extra: int) -> torch.Tensor:
        """Token ids [B, T] on the model's device of a text (or ids), checked to fit the context (seq_len
        positions, plus `extra` tokens that are only targets) and to hold at least 1 + `extra` tokens."""
        ids = self.encode(text) if isinstance(text, str) else torch.as_tensor(text, dtype=torch.long)
        ids = ids[None] if ids.dim() == 1 else ids
        if ids.dim() != 2:
            raise ValueError(f"token ids of shape {tuple(ids.shape)}; fix: give a text, or ids as [T] or [B, T]")
        T, limit = ids.size(1), self.config.seq_len + extra
        if not 1 + extra <= T <= limit:
            raise ValueError(
                f"the text is {T} token{'s' * (T != 1)}; this takes {1 + extra} to {limit} (seq_len "
                f"{self.config.seq_len}{' and one more token, a target only' if extra else ''}); "
                f"fix: give a text of that length"
            )
        return ids.to(self.network.wte.weight.device)


# --------------------------------------------------------------------------------------------- loading
def load(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Model:
    """Open a trained model: a `Model` in eval mode on `device`, in `dtype`, with its tokenizer.

    `path`: a checkpoint file written by `loopnet fit` (``.ckpt``); a run folder (``runs/<run name>``: the
    newest ``last*.ckpt`` of its one version with checkpoints), a version folder or a ``checkpoints/``
    folder (its newest ``last*.ckpt``); or a model folder written by `loopnet export`, `loopnet import` or
    `loopnet retrofit` (``config.json`` and ``model.safetensors``; an imported model with the source's own
    tokenizer). Checkpoints are read with torch's restricted (weights_only) unpickler and model folders without
    unpickling; the weights are used as read (no copy) when `device` and `dtype` are theirs. A sharded (FSDP)
    checkpoint folder is refused with the command that consolidates it."""
    from loopnet.checkpoints import is_sharded_checkpoint, load_checkpoint_meta, model_weights

    where = Path(path).expanduser()
    device = torch.device(device)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(
            f"dtype={dtype!r} is not a floating-point torch dtype; fix: give e.g. torch.float32 or torch.bfloat16"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available; fix: load with device='cpu'")
    if not where.exists():
        raise FileNotFoundError(
            f"{where} does not exist; fix: give a .ckpt file, a run folder (runs/<run name>) "
            f"or a folder written by loopnet export or import"
        )
    if is_exported(where):  # `loopnet export`, `import` or `retrofit`
        config, weights, meta = _read_exported(where)
        tokenizer = _tokenizer(meta.get("vocab", "gpt2"), meta.get("data"), meta.get("vocab_ids"), where)
        return Model(build_network(config, weights, device, dtype), tokenizer)
    ckpt_path = where if where.is_file() or is_sharded_checkpoint(where) else _folder_checkpoint(where)
    ckpt = load_checkpoint_meta(str(ckpt_path))
    config, weights = model_weights(ckpt, ckpt_path, gpt2_ids=False)
    data = ckpt.get("datamodule_hyper_parameters") or {}
    tokenizer = _tokenizer(data.get("vocab", "gpt2"), data, None, ckpt_path)
    return Model(build_network(config, weights, device, dtype), tokenizer)


def is_exported(folder: Path) -> bool:
    """A model folder written by `loopnet export`, `import` or `retrofit`: config.json beside model.safetensors
    (or its shards' index)."""
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in EXPORTED_WEIGHTS)


def _folder_checkpoint(folder: Path) -> Path:
    """The checkpoint a folder names: its newest last*.ckpt as a checkpoints/ folder, as a version folder
    (checkpoints/ under it), or as a run folder (version_*/checkpoints/ under it, from one version only)."""
    from loopnet.checkpoints import newest_last_checkpoint, run_checkpoint

    found = newest_last_checkpoint(folder) or newest_last_checkpoint(folder / "checkpoints")
    if found is None:
        versions = sorted(
            {p.parent.parent.name for p in folder.glob("version_*/checkpoints/last*.ckpt")},
            key=lambda name: (len(name), name),
        )
        if len(versions) > 1:
            raise ValueError(
                f"{folder} holds checkpoints of {len(versions)} versions ({', '.join(versions)}); fix: "
                f"load one version folder, e.g. {folder / versions[-1]}"
            )
        found = run_checkpoint(folder)
    if found is None:
        # other checkpoints of this folder (best-*.ckpt), or the runs of a save_dir (runs/<run>/version_N/...)
        others = [
            p
            for pattern in (
                "*.ckpt",
                "checkpoints/*.ckpt",
                "version_*/checkpoints/*.ckpt",
                "*/version_*/checkpoints/last*.ckpt",
            )
            for p in sorted(folder.glob(pattern))
        ]
        hint = f", e.g. {others[0]}" if others else ""
        raise ValueError(
            f"{folder} is not a loopnet checkpoint, run folder or exported folder (no last*.ckpt in it, "
            f"its checkpoints/ or version_*/checkpoints/, and no config.json + model.safetensors); fix: "
            f"give a .ckpt file{hint}, a run folder, or a folder written by loopnet export or import"
        )
    return found


def _read_exported(folder: Path) -> tuple[LoopConfig, dict[str, torch.Tensor], dict]:
    """`loopnet.formats.hf.read_exported(folder)`: (config, state dict memory-mapped from safetensors,
    metadata with at least the data's `vocab`)."""
    from loopnet.formats.hf import read_exported  # safetensors and the format's code only when a folder is read

    return read_exported(folder)


def _tokenizer(vocab: str, data: dict | None, ids, where: Path) -> Vocabulary:
    """The vocabulary a run trained with: GPT-2's or bytes by name; a tokenizer.json's (`data.tokenizer`, else the
    folder `where`); a compact one from its GPT-2 `ids` when given, else rebuilt from the corpus that the run's
    data settings `data` name (as `loopnet predict` does)."""
    if vocab not in VOCABULARIES:
        raise ValueError(
            f"{where} names data.vocab {vocab!r}, which this loopnet does not know "
            f"({', '.join(VOCABULARIES)}); fix: load it with the loopnet that trained it"
        )
    if vocab == "tokenizer":  # a tokenizer.json: an imported folder's own, or the one the run's data.tokenizer names
        return VOCABULARIES[vocab](str((data or {}).get("tokenizer") or where))
    if not VOCABULARIES[vocab].reads_corpus:
        return VOCABULARIES[vocab]()
    if ids is not None:
        return CompactVocab(ids)
    from loopnet.data.datamodule import TokenStreamDataModule
    from loopnet.data.errors import DataConfigError

    try:  # the corpus's own ids: read from the corpus the run was trained on
        return TokenStreamDataModule(**(data or {})).vocabulary
    except (DataConfigError, TypeError, OSError) as err:
        why = (str(err).splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"{where} was trained on a compact vocabulary (its corpus's own token ids), rebuilt from "
            f"that corpus, which could not be read ({why}); fix: load it where its data.path is "
            f"readable"
        ) from None
