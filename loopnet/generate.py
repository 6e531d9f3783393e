"""Generation from a `LoopedTransformer`: continue prompts token by token, with the KV cache across rounds
(`loopnet.model.cache`), a recompute path without it, and per-token adaptive exit (`loopnet.model.exit`).

    generate(model, prompts, max_new_tokens, ...)   the token loop: sample, stop, drop finished rows
      _Cached      a cache per attention visit; each new token runs over its own position only
      _Recompute   the whole (cropped) window through the model for every token, as nanoGPT does
    _final_state   what the head reads after R' rounds and the coda (a compiled step compiles it)
    _exit_logits   the rounds of one token under an exit criterion, up to the round it exits at

`model` is a `loopnet.model.LoopedTransformer` (typed `nn.Module`: its `generate` method delegates here, and
this module does not import it back). The network takes a cache through its `kv=` arguments and knows nothing
else of generation. Docs: docs/inference.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from loopnet.model.cache import KVCache
from loopnet.model.exit import ExitCriterion, check_exit
from loopnet.model.head import GreedyScreen, HeadColumns

# Inductor's options for a compiled decode step: its one-row matmuls (one position, batch 1) as fused
# multiply-reductions in inductor's own C++ kernels instead of a BLAS call each (inductor's decompose_mm
# pass; on CPU it applies to a first dimension of 1 and other dimensions up to 2048). A cached token's
# matmuls are tiny, and a BLAS call's overhead (and MKL's generic path on AMD) outweighs the work: the
# whole step becomes one kernel. No effect on a GPU's decode (the pass needs there a first dimension of 10240+).
DECODE_OPTIONS = {"post_grad_fusion_options": {"decompose_mm_pass": {}}}


@dataclass
class Generation:
    """What `generate` returns: the new token ids of each prompt, in prompt order, and the rounds each
    new token ran (R' for every token unless an exit criterion stops it earlier)."""

    tokens: list[list[int]]
    rounds: list[list[int]]

    def mean_rounds(self) -> float:
        """Mean rounds per generated token (nan when none was generated)."""
        counts = [r for row in self.rounds for r in row]
        return sum(counts) / len(counts) if counts else float("nan")


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None = None) -> torch.Tensor:
    """Next token ids [B, 1] from last-position logits [B, V]: greedy when temperature <= 0,
    otherwise sampled from softmax(logits / temperature), restricted to the top_k most likely."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(int(top_k), logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    return torch.multinomial(F.softmax(logits, -1), 1)


@torch.inference_mode()
def generate(
    model: nn.Module,
    prompts: torch.Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    rounds: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    n_vocab: int | None = None,
    window: int | None = None,
    stop: Callable[[int, list[int]], bool] | None = None,
    cache: bool = True,
    exit: str = "none",
    exit_threshold: float | None = None,
    max_rounds: int | None = None,
    compile: bool = False,
    interrupted: Callable[[], bool] | None = None,
) -> Generation:
    """Continue each prompt (token ids; a [B, T] tensor is B prompts) by up to `max_new_tokens` tokens
    at R' = `rounds`, with `sample_next(temperature, top_k)` over the first `n_vocab` ids (default all).

    Context: each sequence reads at most its last `window` tokens (default seq_len). Prompts of
    unequal length are right-padded; attention is causal and positions count from 0, so the padding
    cannot change the logits at a sequence's own positions. A prompt is done when `stop(i, its new
    tokens)` is true; it then leaves the batch. Dropout follows the module's mode: call `eval()` first.

    `cache` (default): the prompt but its last token runs once through the prelude, every round and
    the coda, its keys and values kept per attention visit (`KVCache`: per prelude block, per
    (round, block) of the core, per coda block); its last token and each new token then run over
    their own position only: the prelude once, the rounds, the coda once on the final state.
    Greedy output equals the recompute's (`cache=False`: the whole window through the model for
    every token, as nanoGPT does). Past the window the context is cropped to its last `window`
    tokens and the cache rebuilt from them: in a looped model every key past round 1's first block
    depends on the tokens before it, so a cache cannot slide; each token past the window therefore
    costs a full forward pass over the window, as without the cache.

    `exit` (`loopnet.model.exit`): a token stops after the first round r ≤ `max_rounds` (default
    R') at which the criterion holds (threshold `exit_threshold`, None: Huginn's default), and its
    next token is drawn from round r's logits. With the cache, its keys and values of round r stand
    in for the rounds it skipped (`KVCache.fill_later_rounds`), and the coda reads its round-r state.
    The prompt's (or a rebuilt context's) tokens but the last run every round. Without the cache the
    window runs every round at every position and the criterion picks the round of the last position
    only. `Generation.rounds` holds the rounds each token used.

    `compile` (with the cache, without an exit criterion): each new token's step up to the final Norm
    (`_final_state`: every round, the coda) runs as one `torch.compile` graph (`DECODE_OPTIONS`) over a
    static cache (`KVCache(static=True)`: fixed shapes, attention over the whole window under a mask);
    the head follows eagerly, but for greedy decoding on CPU, where the step ends in the argmax of a
    bf16 copy of the head that a rounding bound proves exact, or leaves a near tie to the fp32 logits
    (`GreedyScreen`). It pays a compile (seconds to tens of seconds, once per model, batch size
    and R') for a faster token: worth it for long generations. The tokens equal the eager cache's up to
    float rounding (the masked attention and the fused matmuls sum in another order).

    `interrupted` (a stop request, e.g. a signal's flag): asked before every token and between the rounds
    of an eager step; once it returns True generation ends, and the tokens generated so far are returned
    (a token whose rounds it cut short is dropped). A compiled step runs its rounds without asking."""
    cfg = model.config
    W = cfg.seq_len if window is None else window
    if not 1 <= W <= cfg.seq_len:
        raise ValueError(f"window must be in [1, seq_len={cfg.seq_len}], got {W}; fix: give a shorter window")
    check_exit(exit, exit_threshold)
    if compile and not (cache and exit == "none"):
        raise ValueError(
            "model.generate.compile needs the cache and no exit criterion (a token's rounds must not "
            "depend on its values); fix: set model.generate.cache: true and model.generate.exit: none, "
            "or compile: false"
        )
    R = (rounds or cfg.n_rounds) if exit == "none" or max_rounds is None else max_rounds
    if R < 1:
        raise ValueError(f"rounds must be >= 1, got {R}; fix: give a round count R' >= 1")
    V = cfg.vocab_size if n_vocab is None else min(n_vocab, cfg.vocab_size)
    sequences = [list(p) for p in (prompts.tolist() if torch.is_tensor(prompts) else prompts)]
    if not all(sequences):
        raise ValueError("every prompt needs at least one token; fix: start an empty prompt with <|endoftext|>")
    if cache:
        # A compiled greedy step ends in the argmax of the head (`GreedyScreen`), any other at the final Norm.
        screen = _screen(model) if compile and temperature <= 0 else None
        steps = _Cached(model, W, R, exit, exit_threshold, interrupted, V, compile, screen)
    else:
        steps = _Recompute(model, W, R, exit, exit_threshold, interrupted)
    new: list[list[int]] = [[] for _ in sequences]
    used: list[list[int]] = [[] for _ in sequences]
    active = list(range(len(sequences)))
    for _ in range(max_new_tokens):
        if not active or (interrupted is not None and interrupted()):
            break
        try:
            tokens, logits, rounds_used = steps.next([sequences[i] for i in active])
        except _Interrupted:
            break
        if tokens is None:
            tokens = sample_next(logits[:, :V].float(), temperature, top_k).squeeze(-1).tolist()
        still = []
        for row, (i, token) in enumerate(zip(active, tokens, strict=True)):
            sequences[i].append(token)
            new[i].append(token)
            used[i].append(rounds_used[row])
            if stop is None or not stop(i, new[i]):
                still.append(row)
        if len(still) < len(active):
            steps.keep(still)
        active = [active[row] for row in still]
    return Generation(new, used)


class _Interrupted(Exception):
    """`interrupted()` returned True between two rounds: the token under way is dropped."""


class _Steps:
    """One token of every active sequence per `next(contexts)`: (tokens or None, logits [B, V] or None,
    rounds used [B]); tokens when the step settled them itself (a compiled greedy step), else the logits
    to sample from. `keep(rows)`: only these rows of the batch go on."""

    def __init__(
        self,
        model: nn.Module,
        W: int,
        R: int,
        exit: str,
        threshold: float | None,
        interrupted: Callable[[], bool] | None,
    ):
        self.model, self.W, self.R, self.exit, self.threshold = model, W, R, exit, threshold
        self.interrupted = interrupted
        self.device = model.wte.weight.device
        self.head: HeadColumns | None = None  # the fp32 head, looked up once, when a token first needs its logits

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        self.head = self.head or _head_columns(self.model)
        return self.head.logits(h)

    def keep(self, rows: list[int]) -> None:
        pass


class _Recompute(_Steps):
    """`cache=False`: the (cropped) window of every sequence, right-padded, through the model for every token."""

    def next(self, contexts: list[list[int]]):
        windows = [c[-self.W :] for c in contexts]
        inputs = torch.zeros(len(windows), max(map(len, windows)), dtype=torch.long)
        for row, w in enumerate(windows):
            inputs[row, : len(w)] = torch.tensor(w)
        inputs = inputs.to(self.device)
        last = torch.tensor([len(w) - 1 for w in windows], device=self.device)
        if self.exit == "none":
            h = _final_state(self.model, inputs, None, last, None, self.R, self.interrupted)
            return None, self.logits(h), [self.R] * len(windows)
        logits, exit_round = _exit_logits(
            self.model, inputs, None, last, None, self.R, self.exit, self.threshold, self.logits, self.interrupted
        )
        return None, logits, exit_round.tolist()


class _Cached(_Steps):
    """`cache=True`: a `KVCache` over each window but its last token, then each sequence's newest token at
    its own next position; rebuilt from the cropped windows once a sequence outgrows the window."""

    def __init__(
        self, model, W, R, exit, threshold, interrupted, n_vocab: int, compile: bool, screen: GreedyScreen | None
    ):
        super().__init__(model, W, R, exit, threshold, interrupted)
        self.n_vocab, self.static, self.screen = n_vocab, compile, screen
        self.kv: KVCache | None = None
        self.step = None
        if compile:
            self.step = torch.compile(
                _final_state if screen is None else _greedy_step, dynamic=False, options=DECODE_OPTIONS
            )

    def prefill(self, windows: list[list[int]]) -> None:
        """A new cache over each window but its last token (right-padded), run through every round; the
        last token then goes as every new token does, one position through the rounds."""
        self.kv = kv = KVCache(len(windows), self.W, self.device, static=self.static)
        width = max(map(len, windows)) - 1
        if width:
            prefix = torch.zeros(len(windows), width, dtype=torch.long)
            for row, w in enumerate(windows):
                prefix[row, : len(w) - 1] = torch.tensor(w[:-1])
            positions = torch.arange(width, device=self.device).expand(len(windows), width)
            kv.begin(positions)
            x = _last_round(
                self.model.iter_rounds(prefix.to(self.device), self.R, positions=positions, kv=kv), self.interrupted
            )
            self.model.finish(x, kv=kv)
            kv.end(torch.tensor([len(w) - 2 for w in windows], device=self.device))

    def next(self, contexts: list[list[int]]):
        if self.kv is None or max(map(len, contexts)) > self.W:
            self.prefill([c[-self.W :] for c in contexts])
        kv = self.kv
        inputs = torch.tensor([[c[-1]] for c in contexts], device=self.device)
        positions = kv.lengths[:, None].clone()
        last = torch.zeros(len(contexts), dtype=torch.long, device=self.device)
        kv.begin(positions)
        if self.exit != "none":
            logits, exit_round = _exit_logits(
                self.model,
                inputs,
                positions,
                last,
                kv,
                self.R,
                self.exit,
                self.threshold,
                self.logits,
                self.interrupted,
            )
            kv.end(positions[:, 0])
            kv.fill_later_rounds(exit_round, self.R, self.model.config.n_blocks, positions[:, 0])
            return None, logits, exit_round.tolist()
        # The compiled step once the cache holds every visit's slot (a one-token prompt fills them in its
        # first step, eagerly); dynamo would not trace their allocation.
        tokens = None
        args = (self.model, inputs, positions, last, kv, self.R)
        if self.step is not None and kv.store and self.screen is not None:
            h, picked, settled = self.step(*args, *self.screen.args(self.n_vocab))
            tokens = picked.tolist() if bool(settled.all()) else None  # else a near tie: fp32 decides
        else:
            h = self.step(*args) if self.step is not None and kv.store else _final_state(*args, self.interrupted)
        kv.end(positions[:, 0])
        return tokens, (None if tokens is not None else self.logits(h)), [self.R] * len(contexts)

    def keep(self, rows: list[int]) -> None:
        self.kv.keep(rows)


def _head_columns(model: nn.Module) -> HeadColumns:
    """The head's weight as column blocks for the next token's fp32 logits (`HeadColumns`), kept on the
    model while the weight is unchanged."""
    chunks = max(1, torch.get_num_threads())
    layout = getattr(model, "_generation_head", None)
    if layout is None or not layout.matches(model.lm_head.weight, chunks):
        model._generation_head = layout = HeadColumns(model.lm_head.weight, chunks)
    return layout


def _screen(model: nn.Module) -> GreedyScreen | None:
    """The head's bf16 copy for a compiled greedy step (`GreedyScreen`), kept on the model while the weight
    is unchanged; None off the CPU (a GPU's F.linear is not the bottleneck there) or when the weight is
    outside bf16's normal range."""
    weight = model.lm_head.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    screen = getattr(model, "_greedy_screen", None)
    if screen is None or not screen.matches(weight):
        model._greedy_screen = screen = GreedyScreen(weight)
    return screen if screen.usable else None


def _final_state(
    model: nn.Module, inputs, positions, last, kv, R: int, interrupted: Callable[[], bool] | None = None
) -> torch.Tensor:
    """What the head reads for each row's next token: the final Norm of the coda's output [B, d] at
    position `last[b]`, after R rounds (the coda, where there is one, reads every position; the head
    then reads only each row's last, as nanoGPT's generate does)."""
    x = _last_round(model.iter_rounds(inputs, R, positions=positions, kv=kv), interrupted)
    return _readout(model, x, last, kv)


def _last_round(rounds, interrupted: Callable[[], bool] | None) -> torch.Tensor:
    """The state x_end of the last of `iter_rounds`'s rounds, asking `interrupted()` after each."""
    for _, x in rounds:
        if interrupted is not None and interrupted():
            raise _Interrupted
    return x


def _greedy_step(model: nn.Module, inputs, positions, last, kv, R: int, *screen_args) -> tuple:
    """`_final_state` h [B, d], then `GreedyScreen.screen(h, *screen_args)`: (h, token [B], settled [B])."""
    h = _final_state(model, inputs, positions, last, kv, R)
    return h, *GreedyScreen.screen(h, *screen_args)


def _readout(model: nn.Module, x: torch.Tensor, last: torch.Tensor, kv: KVCache | None) -> torch.Tensor:
    """What the head reads [B, d] (`head_input`: the final Norm) of the coda's output on the loop state x, at each
    row's position `last[b]`."""
    return model.head_input(model.finish(x, kv=kv)[torch.arange(x.size(0), device=x.device), last])


def _exit_logits(
    model: nn.Module,
    inputs,
    positions,
    last,
    kv,
    R: int,
    exit: str,
    threshold,
    head_logits: Callable[[torch.Tensor], torch.Tensor],
    interrupted: Callable[[], bool] | None = None,
):
    """(next-token logits [B, V] at each row's position `last[b]`, the round each row exited at [B]) under
    the exit criterion `exit`; `head_logits` maps a final state [B, d] to its logits.

    Runs up to R rounds and stops once every row exited. With the cache (one position per row) the
    coda, where there is one, reads and writes the cache at each readout; it runs once more at the
    end on the state each token leaves with, so that its keys and values are that state's (its
    logits are the chosen ones: the same computation)."""
    B = inputs.size(0)
    rows = torch.arange(B, device=inputs.device)
    exit_round = torch.full((B,), R, dtype=torch.long, device=inputs.device)

    def readout(x):  # logits [B, V] at each row's last position of the loop state x
        return head_logits(_readout(model, x, last, kv))

    criterion = ExitCriterion(exit, threshold, model)
    done = torch.zeros(B, dtype=torch.bool, device=inputs.device)
    chosen_logits = chosen_x = None
    for r, x in model.iter_rounds(inputs, R, positions=positions, kv=kv, start=True):
        if r == 0:
            criterion.start(x[rows, last])
            continue
        if interrupted is not None and interrupted():
            raise _Interrupted
        logits = readout(x) if criterion.needs_logits or r == R else None
        exits, _ = criterion.step(x[rows, last], logits)
        newly = exits & ~done if r < R else ~done
        if newly.any():
            logits = readout(x) if logits is None else logits
            pick = newly[:, None]
            chosen_logits = logits.clone() if chosen_logits is None else torch.where(pick, logits, chosen_logits)
            if kv is not None:
                chosen_x = x.clone() if chosen_x is None else torch.where(pick[:, None], x, chosen_x)
            exit_round[newly] = r
            done |= newly
        if bool(done.all()):
            break
    if kv is not None and model.coda_blocks:
        return readout(chosen_x), exit_round
    return chosen_logits, exit_round
