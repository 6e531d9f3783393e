"""The exported model under transformers (`AutoModelForCausalLM`, trust_remote_code) against loopnet's own, for every
residual scheme, every wiring and every recipe option, on tiny random models.

Tolerance. The exported modeling file is loopnet's model source inlined (`loopnet.formats.hf.modeling_source`),
so the transformers model runs the same operations, in the same order, on the same fp32 weights (safetensors
holds them bit for bit) in the same process: on one CPU that arithmetic is deterministic, and the logits must be
equal bit for bit, a tolerance of 0. Any difference is a drift between the files (or a weight that did not load).

Generation: transformers' greedy `generate` with the exported cache (one entry per (round, block)) must give the
tokens of loopnet's `generate(temperature=0)` at an R' other than the training R. The two caches fill the
prompt in different calls (transformers: the whole prompt at once; loopnet: all but its last token, then the
last), so their logits agree to rounding only; the tokens agree unless two logits lie within that rounding,
which these seeds do not have.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loopnet.formats import hf

from .helpers import save_checkpoint, tiny_model

ROOT = Path(__file__).resolve().parents[2]

SCHEMES = [{"residual": r} for r in ("preln", "postln", "deepnorm", "deeploop", "scaled")]
WIRINGS = [
    {"wiring": "carry"},
    {"wiring": "lt"},
    {"wiring": "flt"},
    {"wiring": "inject", "injection": "add", "inject_into": "first"},
    {"wiring": "inject", "injection": "add", "inject_into": "every"},
    {"wiring": "inject", "injection": "attention", "inject_into": "first"},
    {"wiring": "inject", "injection": "attention", "inject_into": "every"},
    {"wiring": "inject", "injection": "linear"},
    {"wiring": "inject", "injection": "diagonal"},
]
RECIPES = [
    {"n_prelude": 1, "n_coda": 2, "wiring": "inject", "injection": "diagonal"},
    {"n_prelude": 2, "residual": "preln"},
    {"qk_norm": True},
    {"positions": "rope"},
    {"positions": "rope", "qk_norm": True, "residual": "preln"},
    {"tie_embeddings": False},
    {"sandwich": True, "residual": "postln"},
    {"sandwich": True},
    {"residual": "preln", "branch_scale": "sqrt_depth", "branch_lambda": 2.0},
    {"residual": "preln", "branch_scale": "wang"},
    {"bias": True, "norm": "layernorm"},
    {"norm_affine": False, "qk_norm": True},
    {"input_norm": True, "wiring": "lt"},
    {"mlp_ratio": 2.5, "n_heads": 2},
]
# μP's and CompleteP's multipliers (logits, attention scale, branch ε) away from their base width and depth
PARAMETRIZATIONS = [
    {"parametrization": "mup", "mup_base_width": 16},
    {"parametrization": "completep", "residual": "preln", "mup_base_width": 16, "completep_base_depth": 2},
]
# the options of the imported and retrofitted architectures (Huginn's block, GPT-2's, Llama's, Ouro's, Parcae's)
IMPORTED = [
    {
        "mlp": "swiglu",
        "ffn_width": 40,
        "qk_bias": True,
        "embed_scale": True,
        "loop_norm": True,
        "positions": "rope",
        "rope_base": 50000.0,
        "norm_eps": 1e-6,
        "sandwich": True,
        "residual": "postln",
        "n_prelude": 1,
        "n_coda": 1,
        "wiring": "inject",
        "injection": "linear",
    },
    {"mlp": "gelu_tanh", "bias": True, "norm": "layernorm", "residual": "preln", "norm_eps": 1e-5},
    {"mlp": "swiglu", "n_kv_heads": 2, "positions": "rope", "residual": "preln"},
    {  # Ouro's: a Norm on each branch output, the final Norm after every round, the exit gate's expected logits
        "residual": "preln",
        "sandwich": True,
        "round_norm": True,
        "exit_gate": True,
        "loss_rounds": "expected",
        "mlp": "swiglu",
        "n_kv_heads": 2,
        "positions": "rope",
        "rope_base": 1e6,
        "tie_embeddings": False,
    },
    {  # Parcae's
        "d_model": 32,
        "n_heads": 4,
        "mlp": "relu2",
        "positions": "rope",
        "residual": "preln",
        "qk_norm": True,
        "qk_norm_gain": False,
        "prelude_norm": True,
        "loop_proj": True,
        "value_embeds": True,
        "n_prelude": 2,
        "n_coda": 1,
        "wiring": "inject",
        "injection": "diagonal",
    },
]
CASES = SCHEMES + WIRINGS + RECIPES + PARAMETRIZATIONS + IMPORTED


def label(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items())


@pytest.fixture(scope="module")
def hf_class(tmp_path_factory):
    """The exported `LoopnetForCausalLM`, loaded once through `AutoModelForCausalLM` (trust_remote_code); every
    exported folder holds the same modeling file."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("first")
    out = hf.export(save_checkpoint(tiny_model(), root / "a.ckpt"), root / "out")
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules.")  # the exported file, not loopnet's module
    return type(model)


@pytest.mark.parametrize("case", CASES, ids=label)
def test_logits_and_greedy_tokens_equal_loopnets(tmp_path, hf_class, case):
    model = tiny_model(seed=len(label(case)), **case)
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt"), tmp_path / "out")
    exported = hf_class.from_pretrained(out).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    R = model.config.n_rounds
    with torch.no_grad():
        for rounds in (None, 1, R + 2):
            expected = model(ids, rounds=rounds)[0]
            got = exported(ids, rounds=rounds).logits
            assert torch.equal(got, expected), f"R'={rounds}: max |Δ| {(got - expected).abs().max():.3g}"
    prompt = ids[:1, :5]
    reference = model.generate(prompt, 6, rounds=R + 2, temperature=0.0).tokens[0]
    generated = exported.generate(prompt, max_new_tokens=6, rounds=R + 2, do_sample=False)
    assert generated[0, 5:].tolist() == reference


def test_the_cache_holds_one_entry_per_round_and_block(tmp_path, hf_class):
    model = tiny_model(n_prelude=1, n_coda=1, wiring="inject", injection="linear")
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt"), tmp_path / "out")
    exported = hf_class.from_pretrained(out).eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        first = exported(ids[:, :5], use_cache=True, rounds=5)
        step = exported(ids[:, 5:], cache=first.cache, rounds=5)
        whole = model(ids, rounds=5)[0]
    K = model.config.n_blocks
    assert sorted(first.cache.kv.store) == sorted(
        [("prelude", 1), ("coda", 1)] + [("core", r, k) for r in range(1, 6) for k in range(1, K + 1)]
    )
    assert first.cache.get_seq_length() == 6
    # One position through the cache against the whole sequence: the same sums in another order. A reordered
    # d-term sum moves by at most γ_d ≈ d·u of its terms' magnitude (u = 2⁻²⁴); each Norm rescales the stream to
    # unit RMS, so the perturbations of the 2N sublayer visits add at most linearly, relative to the logits' scale.
    bound = 2 * model.config.depth(5) * model.config.d_model * 2.0**-24 * float(whole.abs().max().clamp(min=1))
    torch.testing.assert_close(step.logits[0, -1], whole[0, -1], rtol=0, atol=bound)
    with pytest.raises(ValueError, match="holds keys and values of R'=5 rounds, this call runs 3"):
        exported(ids[:, 5:], cache=first.cache, rounds=3)


def test_the_exported_code_needs_no_loopnet(tmp_path):
    """The folder's modeling and configuration files run with loopnet unimportable: only torch and transformers."""
    model = tiny_model(positions="rope", n_coda=1)
    out = hf.export(save_checkpoint(model, tmp_path / "a.ckpt"), tmp_path / "out")
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids)[0]
    torch.save({"ids": ids, "expected": expected}, tmp_path / "io.pt")
    code = f"""
import sys
sys.modules["loopnet"] = None  # any import of loopnet fails
import torch
from transformers import AutoModelForCausalLM
io = torch.load({str(tmp_path / "io.pt")!r})
model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)
with torch.no_grad():
    assert torch.equal(model(io["ids"]).logits, io["expected"])
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_modeling_file_is_loopnets_model_source():
    """One source of truth: every loopnet.model module the wrapper reads is inlined with its own text (less its
    loopnet imports), so a change to the model changes the exported file."""
    source = hf.modeling_source()
    for module in ("layers", "transformer", "cache", "config", "scales", "injection", "kernels"):
        text = (ROOT / "loopnet" / "model" / f"{module}.py").read_text()
        imports = ("from .", "from loopnet", "import ", "from __future__")
        body = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(imports)]
        assert all(line in source for line in body), module
    assert not re.findall(r"^\s*(?:from|import)\s+\.?loopnet", source, flags=re.MULTILINE)
    assert "from .configuration_loopnet import LoopnetConfig" in source  # the file shipped beside it
