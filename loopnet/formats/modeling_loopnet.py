"""A loopnet `LoopedTransformer` as a transformers causal LM (`AutoModelForCausalLM` with trust_remote_code).

In loopnet this module imports the model from `loopnet.model`; `loopnet export` writes it into the
exported folder as one file with those modules inlined above it (`loopnet.formats.hf.modeling_source`),
so that the exported model runs loopnet's own forward code, needing only torch and transformers.

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    model(ids).logits                                  # at the training R
    model(ids, rounds=12).logits                       # at R' = 12 (α, β of the training depth)
    model.generate(ids, max_new_tokens=20, rounds=12)  # cached: one key/value entry per (round, block)
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from loopnet.model.cache import KVCache
from loopnet.model.config import LoopConfig
from loopnet.model.layers import Rotary
from loopnet.model.transformer import LoopedTransformer

from .configuration_loopnet import LoopnetConfig


def loop_config(config) -> LoopConfig:
    """The `LoopConfig` of a transformers config: its LoopConfig fields (a field it lacks takes the default)."""
    names = [f.name for f in dataclasses.fields(LoopConfig)]
    return LoopConfig(**{name: getattr(config, name) for name in names if hasattr(config, name)})


class LoopnetCache(Cache):
    """loopnet's `KVCache` as a transformers Cache: keys and values per attention visit, one entry per
    prelude block, per (round, block) of the loop and per coda block. Made at the first cached forward;
    it holds the round count R' it was filled at, since every later token must read the same visits."""

    is_compileable = False

    def __init__(self):
        super().__init__(layers=[])
        self.kv: KVCache | None = None
        self.rounds: int | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.kv is None else int(self.kv.lengths.max())

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1 if self.kv is None else self.kv.capacity

    @property
    def is_croppable(self) -> bool:
        return False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.kv.keep(beam_idx.tolist())


class LoopnetForCausalLM(PreTrainedModel, GenerationMixin):
    """`LoopedTransformer` under `model.` (its state-dict keys prefixed), with transformers' loading,
    `generate` and loss convention (`labels` = the input ids, shifted inside, -100 ignored)."""

    config_class = LoopnetConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]  # noqa: RUF012 (transformers reads these class attributes)
    _tied_weights_keys = {"model.lm_head.weight": "model.wte.weight"}  # noqa: RUF012

    def __init__(self, config: LoopnetConfig):
        super().__init__(config)
        self.model = LoopedTransformer(loop_config(config))
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is a `LoopnetCache`, made by `forward`

    def _init_weights(self, module) -> None:
        # Weights come from the exported files; only the rotary tables (not stored: transformers allocates
        # them empty) are computed, as `Rotary` does.
        if isinstance(module, Rotary):
            fresh = Rotary(2 * module.cos.size(-1), module.cos.size(-2), module.base)
            module.cos, module.sin = fresh.cos.to(module.cos.device), fresh.sin.to(module.sin.device)

    def get_input_embeddings(self):
        return self.model.wte

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        cache: LoopnetCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        rounds: int | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits [B, T, V] after R' = `rounds` rounds (default the training R), V the vocabulary's real ids
        (`loopnet_n_vocab`). Without a cache the whole sequence runs through `LoopedTransformer.forward`; with
        `use_cache` (generate sets it) or a `cache`, the new tokens run over their own positions and their keys
        and values join the cache."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "loopnet's model attends causally from position 0 and takes no padding mask; fix: pass "
                "prompts of equal length (or one at a time), or pad on the right and ignore the padding"
            )
        model = self.model
        R = model.config.n_rounds if rounds is None else int(rounds)
        if cache is None and use_cache:
            cache = LoopnetCache()
        if cache is None:
            logits, _ = model(input_ids, rounds=R)
        else:
            B, T = input_ids.shape
            if cache.kv is None:
                cache.kv, cache.rounds = KVCache(B, model.config.seq_len, input_ids.device), R
            elif cache.rounds != R:
                raise ValueError(
                    f"the cache holds keys and values of R'={cache.rounds} rounds, this call runs "
                    f"{R}; fix: pass the same rounds in every call that shares a cache"
                )
            kv = cache.kv
            positions = kv.lengths[:, None] + torch.arange(T, device=input_ids.device)
            kv.begin(positions)
            *_, (_, x) = model.iter_rounds(input_ids, R, positions=positions, kv=kv)
            logits, _ = model.head(x, kv=kv)
            kv.end(positions[:, -1])
        logits = logits[..., : self.config.loopnet_n_vocab]  # None: every id
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
