"""An lm-evaluation-harness model for loopnet checkpoints, at any test-time round count R'.

    lm = LoopnetLM(ckpt_path="runs/.../last.ckpt", rounds=3)
    lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"])

Registered with the harness as ``loopnet``, so ``--model loopnet --model_args ckpt_path=X,rounds=3``
works wherever this module has been imported (``python -m loopnet.eval.harness`` is the stock
``lm_eval`` command line with it imported).

The scoring follows the harness's own Hugging Face model (``lm_eval/models/huggingface.py``) and
reuses its utilities: requests are sorted by length and batched by ``Collator`` (which also
scores the choices of a multiple-choice item that differ only in their last token from a single
forward pass), inputs longer than the window keep their *last* ``max_length`` tokens (left
truncation), and ``loglikelihood_rolling`` cuts a document into the windows of
``get_rolling_token_windows``. Text is tokenised with GPT-2's BPE (``loopnet.data.gpt2_encoding``),
the tokenizer loopnet trains with; log-probabilities are normalised over the 50257 real GPT-2 ids,
not over the ids the vocabulary is padded with.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

# Import the harness's model table *before* registering ours: the registry imports it lazily only
# while it is empty, so registering "loopnet" first would hide "hf", "vllm", ... from get_model().
import lm_eval.models  # noqa: F401
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    Collator,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from loopnet.checkpoints import build_network, load_checkpoint_meta, model_weights
from loopnet.data.token_ids import N_VOCAB
from loopnet.generate import Generation, generate
from loopnet.model import LoopConfig, LoopedTransformer
from loopnet.model.exit import check_exit, exit_logits

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16


def load_checkpoint(ckpt_path: str | Path, device: str | torch.device = "cpu") -> LoopedTransformer:
    """Build the `LoopedTransformer` of a `LoopedLM` checkpoint and load its weights, in eval mode.

    Only the model config and weights are read, with torch's restricted (``weights_only``)
    unpickler (`loopnet.checkpoints.load_checkpoint_meta`, as `loopnet fit/test` read them), so no
    Lightning state or arbitrary pickled objects are needed.
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # refuses pickled code and names a corrupt file in one line; then a checkpoint that is not loopnet's
    return build_network(*model_weights(load_checkpoint_meta(str(path)), path), device)


def _parse_batch_size(batch_size: int | str | None) -> int:
    """The harness's CLI passes batch sizes as strings and allows "auto"; we take a fixed size."""
    if batch_size is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
        log.warning("loopnet: batch_size=%s is not supported, using %d", batch_size, DEFAULT_BATCH_SIZE)
        return DEFAULT_BATCH_SIZE
    size = int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    return size


@register_model("loopnet")
class LoopnetLM(TemplateLM):
    """A loopnet `LoopedTransformer` as an lm-evaluation-harness language model.

    Args:
        ckpt_path: A `LoopedLM` checkpoint (``.ckpt``), loaded unless `model` is given (then it is
            only recorded in the results).
        model: An already built `LoopedTransformer` (used as is, moved to `device`, set to eval), so
            that several R' can share one loaded checkpoint.
        rounds: Round count R' the model runs at; None means the training R (``config.n_rounds``).
        batch_size: Sequences per forward pass.
        device: Torch device, e.g. "cpu" or "cuda".
        max_length: Context window in tokens; default and maximum ``config.seq_len``.
        max_gen_toks: Default number of tokens `generate_until` produces when the task sets none.
        logits_cache: Score the choices that differ only in their last token with one forward pass
            (the harness's one-token-continuation cache).
        exit: Adaptive exit per token (`loopnet.model.exit`): "none", "kl", "latent", "entropy" or
            "argmax"; `rounds` is then the most rounds a token runs. Scoring takes each position's
            prediction from the round it exits at (`exit_logits`); generation stops each new token's
            rounds there. The mean rounds per token of each task are kept (`mean_rounds_by_task`).
        exit_threshold: The criterion's threshold (None: its default).
        **kwargs: Other harness options (e.g. max_batch_size) are accepted and ignored.
    """

    def __init__(
        self,
        ckpt_path: str | None = None,
        rounds: int | None = None,
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        device: str | None = "cpu",
        max_length: int | None = None,
        max_gen_toks: int = 256,
        logits_cache: bool = True,
        model: LoopedTransformer | None = None,
        exit: str = "none",
        exit_threshold: float | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        # The tokenizer comes from loopnet.data; imported here so that `import loopnet.eval.adapter`
        # (which registers the model) stays cheap.
        from loopnet.data import gpt2_encoding

        if ckpt_path is None and model is None:
            raise ValueError("LoopnetLM needs ckpt_path=... (or a built model=...)")
        ignored = {k: v for k, v in kwargs.items() if v is not None and k != "max_batch_size"}
        if ignored:
            log.warning("loopnet: ignoring unsupported model arguments %s", ignored)
        self._device = torch.device(device or "cpu")
        if self._device.type == "cuda" and not torch.cuda.is_available():
            # The harness's own CLI defaults to cuda:0; like its HF model, fall back to the CPU.
            log.warning("loopnet: device %s requested but CUDA is not available; using cpu", device)
            self._device = torch.device("cpu")
        self.ckpt_path = None if ckpt_path is None else str(ckpt_path)
        self.model = load_checkpoint(ckpt_path, self._device) if model is None else model.to(self._device).eval()
        config: LoopConfig = self.model.config
        # GPT-2's BPE, or an imported model's own tokenizer (`loopnet.formats.tokenizer.HFTokenizer`).
        self.encoding = gpt2_encoding() if tokenizer is None else tokenizer
        self.vocab_size = N_VOCAB if tokenizer is None else tokenizer.n_vocab
        if config.vocab_size < self.vocab_size:
            raise ValueError(
                f"the model's vocab_size={config.vocab_size} is smaller than its tokenizer's {self.vocab_size} ids "
                f"({'GPT-2' if tokenizer is None else tokenizer.name})"
            )
        self.rounds = config.n_rounds if rounds is None else int(rounds)
        if self.rounds < 1:
            raise ValueError(f"rounds (R') must be >= 1, got {self.rounds}")
        if max_length is not None and not 1 <= int(max_length) <= config.seq_len:
            raise ValueError(f"max_length must be in [1, seq_len={config.seq_len}], got {max_length}")
        self._max_length = int(max_length or config.seq_len)
        self._max_gen_toks = int(max_gen_toks)
        self.batch_size = _parse_batch_size(batch_size)
        self.logits_cache = bool(logits_cache)
        check_exit(exit, None if exit_threshold is None else float(exit_threshold), where="exit settings:")
        self.exit, self.exit_threshold = exit, None if exit_threshold is None else float(exit_threshold)
        self._rounds_used: dict[str, list[float]] = {}  # task: [sum of rounds over scored tokens, tokens]
        self._request_rounds: list[tuple[float, int]] = []  # per request of the last batch call: (sum, count)

    # ----------------------------------------------------------------------------- harness API
    @property
    def eot_token_id(self) -> int:
        return self.encoding.eot_token

    @property
    def prefix_token_id(self) -> int:
        # GPT-2 has no BOS; like the harness's HF model for gpt2, an empty context is <|endoftext|>.
        return self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.encoding, "name", "gpt2")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # A literal "<|endoftext|>" in the text becomes the EOT id, as with Hugging Face's GPT-2 tokenizer.
        return self.encoding.encode(string, allowed_special="all")

    def tok_decode(self, tokens: list[int] | int, skip_special_tokens: bool = False) -> str:
        return self.encoding.decode([tokens] if isinstance(tokens, int) else list(tokens))

    def get_model_info(self) -> dict[str, Any]:
        """Recorded by the harness in its results' ``config``."""
        cfg = self.model.config
        return {
            "ckpt_path": self.ckpt_path,
            "rounds": self.rounds,
            "train_rounds": cfg.n_rounds,
            "n_blocks": cfg.n_blocks,
            "residual": cfg.residual,
            "wiring": cfg.wiring,
            "seq_len": cfg.seq_len,
            "exit": self.exit,
            "exit_threshold": self.exit_threshold,
            "model_num_parameters": self.model.num_params(non_embedding=False),
        }

    # ----------------------------------------------------------------------------- model calls
    @torch.inference_mode()
    def _logits(self, sequences: list[list[int]]) -> torch.Tensor:
        """Logits over the real GPT-2 ids, [B, T, 50257] float32, for right-padded sequences.

        Right padding is harmless: attention is causal and positions count from 0, so the padding
        after a sequence cannot change the logits at its own positions.
        """
        width = max(len(s) for s in sequences)
        batch = torch.full((len(sequences), width), self.eot_token_id, dtype=torch.long)
        for i, seq in enumerate(sequences):
            batch[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        logits, rounds = exit_logits(
            self.model, batch.to(self._device), self.exit, self.exit_threshold, self.rounds, n_vocab=self.vocab_size
        )
        self._last_rounds = rounds
        return logits[..., : self.vocab_size].float()

    # ----------------------------------------------------------------------------- rounds used
    def _record(self, requests: list[Instance]) -> None:
        """Add the last call's rounds per request to their tasks' totals."""
        for request, (total, count) in zip(requests, self._request_rounds, strict=True):
            cell = self._rounds_used.setdefault(getattr(request, "task_name", None) or "?", [0.0, 0])
            cell[0] += total
            cell[1] += count

    def mean_rounds_by_task(self) -> dict[str, float]:
        """{task: mean rounds per scored or generated token} over the requests seen so far."""
        return {task: total / count for task, (total, count) in self._rounds_used.items() if count}

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        self._record(requests)
        return results

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        """(log P(continuation | context), whether greedy decoding yields the continuation) per request.

        Each request is (cache key or None, context tokens, continuation tokens).
        """

        def by_length(req):
            # Longest first (as the harness does): the first batch shows the worst-case memory.
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        def shared_prefix(req):
            return req[1] + req[2][:-1]

        reorder = Collator(
            requests, sort_fn=by_length, group_by="contexts" if self.logits_cache else None, group_fn=shared_prefix
        )
        results: list[tuple[float, bool]] = []
        used: list[tuple[float, int]] = []
        pbar = tqdm(total=len(requests), disable=disable_tqdm, desc=f"loglikelihood R'={self.rounds}")
        for chunk in reorder.get_batched(n=self.batch_size):
            inputs = []
            for _, context, continuation in chunk:
                if not context or not continuation:
                    raise ValueError("loglikelihood needs a non-empty context and continuation")
                if len(continuation) > self.max_length:
                    raise ValueError(
                        f"a continuation of {len(continuation)} tokens does not fit the model's window "
                        f"of {self.max_length}"
                    )
                # Left truncation: keep the last max_length + 1 tokens; the last is only a target.
                inputs.append((context + continuation)[-(self.max_length + 1) :][:-1])
            logits = self._logits(inputs)
            for (key, context, continuation), inp, row, rounds in zip(
                chunk, inputs, logits, self._last_rounds, strict=True
            ):
                # Position t predicts token t + 1, so the continuation is read off the last len(cont)
                # positions of the unpadded input.
                logprobs = F.log_softmax(row[len(inp) - len(continuation) : len(inp)], dim=-1).unsqueeze(0)
                greedy = logprobs.argmax(dim=-1)
                # Requests sharing context + continuation[:-1] are all answered from these logprobs.
                for key_i, cont_i, logprobs_i in reorder.get_cache(
                    req_str=key, cxt_toks=context, cont_toks=continuation, logits=logprobs
                ):
                    target = torch.tensor(cont_i, dtype=torch.long, device=logprobs_i.device).unsqueeze(0)
                    n = target.shape[1]
                    token_logprobs = torch.gather(logprobs_i[:, -n:], 2, target.unsqueeze(-1)).squeeze(-1)
                    answer = (float(token_logprobs.sum()), bool((greedy[:, -n:] == target).all()))
                    results.append(answer)
                    used.append((float(rounds[len(inp) - n : len(inp)].sum()), n))
                    if key_i is not None:  # rolling windows are cached per document instead
                        self.cache_hook.add_partial("loglikelihood", key_i, answer)
                    pbar.update(1)
        pbar.close()
        self._request_rounds = reorder.get_original(used)
        return reorder.get_original(results)

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole documents, in windows of `max_length` tokens (for perplexity tasks).

        Every token is predicted once, conditioned on as many preceding tokens as fit the window;
        the first token is conditioned on <|endoftext|>.
        """
        windows: list[tuple[None, list[int], list[int]]] = []
        owner: list[int] = []
        for i, request in enumerate(tqdm(requests, disable=disable_tqdm, desc="rolling windows")):
            (text,) = request.args
            pairs = get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(make_disjoint_window, pairs):
                windows.append((None, context, continuation))
                owner.append(i)
        totals = [0.0] * len(requests)
        used = [(0.0, 0)] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm), strict=True):
            totals[i] += logprob
        for i, (total, count) in zip(owner, self._request_rounds, strict=True):
            used[i] = (used[i][0] + total, used[i][1] + count)
        self._request_rounds = used
        self._record(requests)
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Continue each context until a stop string, <|endoftext|> or `max_gen_toks` tokens.

        Decoding is greedy unless the task sets ``do_sample: true`` (then ``temperature`` and
        ``top_k`` are honoured). Keys and values are cached across rounds; a sequence reads at most its
        last `max_length` tokens, and longer contexts are left-truncated to leave room for the generation.
        """

        def by_length(args):
            return -len(self.tok_encode(args[0])), args[0]

        reorder = Collator(
            [r.args for r in requests], sort_fn=by_length, group_by="gen_kwargs", group_fn=lambda a: a[1]
        )
        eos = self.tok_decode(self.eot_token_id)
        results: list[str] = []
        used: list[tuple[float, int]] = []
        pbar = tqdm(total=len(requests), disable=disable_tqdm, desc=f"generate_until R'={self.rounds}")
        for chunk in reorder.get_batched(n=self.batch_size):
            contexts, all_kwargs = zip(*chunk, strict=True)
            gen_kwargs = all_kwargs[0]  # Collator groups requests with equal generation kwargs
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_new = kwargs.pop("max_gen_toks")
            # As the harness does: leave room in the window for the tokens to generate.
            budget = self.max_length - max_new if max_new < self.max_length else self.max_length
            prompts = [self.tok_encode(c)[-budget:] or [self.prefix_token_id] for c in contexts]
            generation = self._generate(prompts, max_new, until, kwargs)
            used += [(float(sum(r)), len(r)) for r in generation.rounds]
            for context, tokens in zip(contexts, generation.tokens, strict=True):
                text = postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=None)
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                pbar.update(1)
        pbar.close()
        self._request_rounds = reorder.get_original(used)
        self._record(requests)
        return reorder.get_original(results)

    def _generate(self, prompts: list[list[int]], max_new: int, until: list[str], kwargs: dict) -> Generation:
        """Generated token ids per prompt (and rounds per token), until <|endoftext|> or a stop string;
        finished rows leave the batch. Keys and values are cached across rounds (`loopnet.generate`)."""
        do_sample = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature", 0.0)) > 0
        temperature, top_k = float(kwargs.get("temperature", 0.0)), kwargs.get("top_k")

        def stop(i: int, new: list[int]) -> bool:
            text = self.tok_decode(new)
            return new[-1] == self.eot_token_id or any(s and s in text for s in until)

        return generate(
            self.model,
            prompts,
            max_new,
            rounds=self.rounds,
            temperature=temperature if do_sample else 0.0,
            top_k=top_k,
            n_vocab=self.vocab_size,
            window=self.max_length,
            stop=stop,
            exit=self.exit,
            exit_threshold=self.exit_threshold,
        )
