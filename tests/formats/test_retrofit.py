"""GPT-2 and Llama retrofit: with every layer kept at R = 1 loopnet's model computes transformers'
GPT2LMHeadModel and LlamaForCausalLM, and `loopnet fit` continues training a retrofitted model."""

import json
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from loopnet.formats import folder as out_folder
from loopnet.formats.retrofit import retrofit
from loopnet.model.transformer import LoopedTransformer
from tests.helpers import run_here

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 6


def gpt2(path: Path, vocab: int = 97, d: int = 32, positions: int = 32) -> GPT2LMHeadModel:
    """A tiny random GPT-2 saved at `path`; its norms and biases moved off their init (ones, zeros) so that each
    reaches the logits."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab, n_positions=positions, n_embd=d, n_layer=LAYERS, n_head=4, bos_token_id=0, eos_token_id=0
        )
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith(".bias"):
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def llama(path: Path) -> LlamaForCausalLM:
    """A tiny random Llama (untied head, grouped-query attention with 2 K/V heads for 4 query heads, rms_norm_eps
    1e-5, rope_theta 500000: none of them loopnet's defaults) saved at `path`."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=80,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def tolerance(cfg, reference: torch.Tensor) -> float:
    """|loopnet − transformers| for one fp32 function summed in two orders: the 2L sublayers and the head each
    sum dot products of length at most n = d_ff (unit roundoff 2⁻²⁴ per term, both sides round), and with
    Pre-LN the stream's errors add across sublayers: 2·(2L + 1)·n·2⁻²⁴·max|logit|. Measured: ~1e-7."""
    return 2 * (2 * LAYERS + 1) * cfg.d_ff * 2.0**-24 * reference.abs().max().item()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def source(tmp_path_factory, request):
    path = tmp_path_factory.mktemp(request.param)
    return path, (gpt2 if request.param == "gpt2" else llama)(path)


@pytest.mark.parametrize(
    "split", [{"plain": True}, {"prelude": 2, "core": 2, "coda": 2}, {"prelude": 1, "core": 4, "coda": 1}]
)
def test_every_layer_kept_at_one_round_computes_gpt2(source, split):
    """The whole stack looped once, or split into prelude / core / coda with no layer dropped and the [0 | I]
    adapter: the logits of transformers' own model."""
    path, hf = source
    cfg, state, layers = retrofit(path, rounds=1, **split)
    assert sorted(layers["prelude"] + layers["core"] + layers["coda"]) == list(range(LAYERS))
    model = LoopedTransformer(cfg).eval()
    model.load_state_dict(state)
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = hf(ids).logits
        logits, _ = model(ids, rounds=1)
    assert (logits - reference).abs().max().item() <= tolerance(cfg, reference)


def test_a_retrofitted_model_generates_alike_with_and_without_the_cache(source):
    """The KV cache per (round, block) holds a looped GQA model's keys and values as the recompute has them."""
    path, _ = source
    cfg, state, _ = retrofit(path, rounds=2, prelude=1, core=2, coda=1)
    model = LoopedTransformer(cfg).eval()
    model.load_state_dict(state)
    prompts = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(2)).tolist()
    assert model.generate(prompts, 6, cache=True).tokens == model.generate(prompts, 6, cache=False).tokens


def test_the_recipes_split_drops_the_middle(source):
    path, _ = source
    cfg, _, layers = retrofit(path)  # defaults: P = C = L/6, K = L/3
    assert layers == {"prelude": [0], "core": [3, 4], "coda": [5]}
    assert (cfg.n_prelude, cfg.n_blocks, cfg.n_coda, cfg.n_rounds, cfg.injection) == (1, 2, 1, 4, "linear")


def test_a_split_larger_than_the_model_is_refused(source):
    with pytest.raises(ValueError, match="do not fit in the model's 6 layers"):
        retrofit(source[0], prelude=3, core=3, coda=3)


def loopnet(*args, cwd):
    return run_here(args, cwd=cwd)


def test_fit_continues_training_a_retrofitted_model(tmp_path):
    """`loopnet retrofit` then `loopnet fit` with configs/retrofit_gpt2.yaml shrunk to the tiny model: the fit starts
    from the retrofitted weights (it refuses a folder of another architecture) and trains them with sampled rounds."""
    gpt2(tmp_path / "gpt2", vocab=50257, d=32, positions=32)
    out = tmp_path / "retro"
    made = loopnet(
        "retrofit",
        str(tmp_path / "gpt2"),
        str(out),
        "--prelude",
        "1",
        "--core",
        "2",
        "--coda",
        "1",
        "--rounds",
        "2",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    tiny = [
        "--config",
        str(ROOT / "configs/retrofit_gpt2.yaml"),
        "--config",
        str(ROOT / "configs/cpu.yaml"),
        "--model.init_weights",
        str(out),
        "--model.config.d_model",
        "32",
        "--model.config.n_heads",
        "4",
        "--model.config.seq_len",
        "32",
        "--model.config.ffn_width",
        "128",
        "--model.config.n_prelude",
        "1",
        "--model.config.n_blocks",
        "2",
        "--model.config.n_coda",
        "1",
        "--model.config.n_rounds",
        "2",
        "--model.config.backprop_rounds",
        "1",
        "--model.config.max_rounds",
        "4",
        "--model.config.round_curriculum_steps",
        "2",
        "--data.batch_size",
        "2",
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "3",
        "--trainer.limit_val_batches",
        "1",
        "--model.eval_rounds",
        "null",
        "--model.optim.lr",
        "1e-3",
        "--model.optim.warmup_steps",
        "1",
    ]
    wrong = loopnet("fit", *tiny, "--model.config.n_blocks", "3", cwd=tmp_path)
    assert wrong.returncode != 0 and "holds another architecture (n_blocks: folder 2 vs config 3)" in wrong.stderr
    fit = loopnet("fit", *tiny, cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/version_0/checkpoints/last.ckpt")
    trained = torch.load(ckpt, weights_only=True)["state_dict"]
    _, start, _ = out_folder.read_folder(out)
    # Three AdamW steps at lr <= 1e-3 move each weight by at most ~3 · lr (|m̂/√v̂| <= 1 in the first steps, plus a
    # decay of lr·wd·|w|): far less than a fresh initialisation's distance (~0.02 per weight).
    moved = max((trained[f"model.{k}"] - v).abs().max().item() for k, v in start.items())
    assert 0 < moved <= 3 * 1e-3 * 1.5
    assert json.loads((out / "config.json").read_text())["loopnet_export"]["source"]["layers"]["core"] == [3, 4]
