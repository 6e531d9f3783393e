"""One reader of configs: the checks run before Lightning loads (loopnet.training.precheck) read a command
line as LightningCLI's parser does, because they are that parser, built from the same signatures without
Lightning. Held three ways: the signatures are the classes' own, the two parsers define the same model
and data options, and every shipped config and a set of bad values (on the command line, in a config, in
an included config) get the same verdict from both, with the same settings read when accepted."""

from __future__ import annotations

import inspect
import io
import sys
import typing
from contextlib import redirect_stderr, redirect_stdout

import pytest

from loopnet.training import precheck as early
from tests.reliability.helpers import ROOT

CONFIGS = ROOT / "configs"
FIT_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.yaml"))  # configs/sweeps/ holds sweep grids, not fit configs
CPU = ["--config", str(CONFIGS / "deeploop_r6.yaml"), "--config", str(CONFIGS / "cpu.yaml")]

FILES = {  # written into the test's working folder
    "bad.yaml": "model:\n  config:\n    n_rounds: 0\n",
    "typo.yaml": "model:\n  optim:\n    warmup_step: 5\n",
    "bad_base.yaml": "model:\n  config:\n    n_rounds: 0\n",
    "outer.yaml": "config: bad_base.yaml\ntrainer:\n  max_steps: 3\n",
    # An include's model section is replaced by the including file's (jsonargparse reads a nested
    # `config:` so): n_rounds 0 is not what either parser ends with, and both accept it.
    "outer_model.yaml": "config: bad_base.yaml\nmodel:\n  optim:\n    lr: 0.01\n",
    "bad_steps_base.yaml": "trainer:\n  max_steps: -5\n",
    "outer_steps.yaml": "config: bad_steps_base.yaml\n",
    "bad_data.yaml": "data:\n  batch_size: 0\n",
    "bad_yaml.yaml": "model: [unclosed\n",
    "empty.ckpt": "",
    "trainer.yaml": "max_steps: 3\n",
}

BAD = {  # id: the command line (subcommand first)
    "argv n_rounds 0": ["fit", *CPU, "--model.config.n_rounds", "0"],
    "argv unknown key": ["fit", *CPU, "--model.config.n_raunds", "3"],
    "argv wrong type": ["fit", *CPU, "--model.config.n_rounds", "many"],
    "argv unknown scheme": ["fit", *CPU, "--model.config.residual", "deepest"],
    "argv lr -1e-3": ["fit", *CPU, "--model.optim.lr", "-1e-3"],
    "argv top_k 0": ["fit", *CPU, "--model.generate.top_k", "0"],
    "argv max_steps -5": ["fit", *CPU, "--trainer.max_steps", "-5"],
    "argv max_steps 0": ["fit", *CPU, "--trainer.max_steps", "0"],
    "argv batch_size 0": ["fit", *CPU, "--data.batch_size", "0"],
    "argv unknown source": ["fit", *CPU, "--data.source", "nowhere"],
    "argv unknown vocab": ["fit", *CPU, "--data.vocab", "tiny"],
    "argv unknown data key": ["fit", *CPU, "--data.batchsize", "4"],
    "argv vocab too small": ["fit", *CPU, "--model.config.vocab_size", "1000"],
    "argv bytes vocab too small": ["fit", *CPU, "--data.vocab", "bytes", "--model.config.vocab_size", "200"],
    "argv unknown option": ["fit", *CPU, "--nonsense", "1"],
    "argv no checkpointing": ["fit", *CPU, "--trainer.enable_checkpointing", "false"],
    "argv missing checkpoint": ["fit", *CPU, "--ckpt_path", "nothing.ckpt"],
    "argv empty checkpoint": ["fit", *CPU, "--ckpt_path", "empty.ckpt"],
    "test without a checkpoint": ["test", *CPU],
    "predict --ckpt_path best": ["predict", *CPU, "--ckpt_path", "best"],
    "config n_rounds 0": ["fit", *CPU, "--config", "bad.yaml"],
    "config unknown key": ["fit", *CPU, "--config", "typo.yaml"],
    "config batch_size 0": ["fit", *CPU, "--config", "bad_data.yaml"],
    "config not YAML": ["fit", *CPU, "--config", "bad_yaml.yaml"],
    "config missing": ["fit", *CPU, "--config", "nope.yaml"],
    "included n_rounds 0": ["fit", *CPU, "--config", "outer.yaml"],
    "included max_steps -5": ["fit", *CPU, "--config", "outer_steps.yaml"],
}

GOOD = {
    "cpu": ["fit", *CPU],
    "included, replaced by the includer's model section": ["fit", *CPU, "--config", "outer_model.yaml"],
    "compact vocabulary (its size is known once the corpus is read)": [
        "fit",
        *CPU,
        "--data.vocab",
        "compact",
        "--model.config.vocab_size",
        "1000",
    ],
    "options of the Trainer and callbacks": [
        "fit",
        *CPU,
        "--trainer.logger.init_args.version",
        "3",
        "--checkpoint.save_top_k",
        "0",
        "--model.optim.betas",
        "[0.9, 0.99]",
        "--model.config.init",
        "null",
        "--model.generate.prompt",
        "ROMEO:",
    ],
    "the Trainer's options from a file": ["fit", *CPU, "--trainer", "trainer.yaml"],
    "max_steps -1 (no limit)": ["fit", *CPU, "--trainer.max_steps", "-1", "--trainer.max_epochs", "1"],
}
CASES = {**BAD, **GOOD}
CASES |= {f"{name} alone": ["fit", "--config", str(CONFIGS / name)] for name in FIT_CONFIGS}
CASES |= {f"{name} on the CPU configs": ["fit", *CPU, "--config", str(CONFIGS / name)] for name in FIT_CONFIGS}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns about the test runner's own arguments
    return tmp_path


def early_verdict(argv: list[str]):
    """(accepted, the settings read or the error line) of the checks before Lightning."""
    try:
        return True, early.precheck(argv)
    except (ValueError, FileNotFoundError) as err:
        return False, str(err)


def lightning_verdict(argv: list[str]):
    """(accepted, the settings read or the error) of LightningCLI's parser and the checks loopnet's CLI runs
    on what it parsed, building nothing; the typed configs it would build are built and so check their
    values, as `LoopedLM` does when instantiated."""
    from loopnet.model.config import LoopConfig
    from loopnet.training.dry_run import CheckOnly
    from loopnet.training.cli import build
    from loopnet.training.options import GenerateConfig, OptimConfig

    got = {}

    class Capture(CheckOnly):
        def instantiate_classes(self) -> None:
            got["cfg"] = self.config[self.subcommand]

    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            build(early.normalize_argv(argv), Capture)
        model = got["cfg"].model
        for cls, values in ((LoopConfig, model.config), (OptimConfig, model.optim), (GenerateConfig, model.generate)):
            cls(**values.as_dict())
    except SystemExit as exit_:
        assert exit_.code == 2, err.getvalue()
        return False, err.getvalue().strip().splitlines()[-1]
    except (ValueError, FileNotFoundError) as error:
        return False, str(error)
    return True, got["cfg"]


@pytest.mark.slow  # ~70 LightningCLI parses: a minute or two on 2 cores
@pytest.mark.parametrize("case", list(CASES))
def test_the_early_checks_and_lightningcli_give_the_same_verdict(folder, case):
    argv = CASES[case]
    (early_ok, early_got), (cli_ok, cli_got) = early_verdict(argv), lightning_verdict(argv)
    assert early_ok == cli_ok, (early_got, cli_got)
    if case in BAD:
        assert not early_ok and "; fix: " in early_got and "\n" not in early_got, early_got
    if case in GOOD:
        assert early_ok
    if early_ok:  # the same settings read, includes and defaults alike
        assert early_got.model.as_dict() == cli_got.model.as_dict()
        assert early_got.data.as_dict() == cli_got.data.as_dict()
        assert early_got.ckpt_path == cli_got.ckpt_path
        steps = early_got.trainer.get("max_steps") if isinstance(early_got.trainer, dict) else None
        assert steps is None or steps == cli_got.trainer.max_steps


def test_the_signatures_read_from_source_are_the_classes_own():
    """`precheck.signature` reads `__init__` from the source file; here the class itself is imported."""
    from loopnet.data import TokenStreamDataModule
    from loopnet.training.module import LoopedLM

    for cls, where in ((LoopedLM, early.MODEL), (TokenStreamDataModule, early.DATA)):
        read, real = inspect.signature(early.signature(*where).__init__), inspect.signature(cls.__init__)
        hints = typing.get_type_hints(cls.__init__)
        assert list(read.parameters) == list(real.parameters)
        for name, param in list(read.parameters.items())[1:]:
            assert param.default == real.parameters[name].default, name
            assert param.annotation == hints[name], name


@pytest.mark.slow
def test_the_two_parsers_define_the_same_options(folder):
    """Every option of the early parser is LightningCLI's with the same type and default; the Trainer's and
    the callbacks' options, Lightning's own, are the only ones it takes as a mapping."""
    from loopnet.training.dry_run import CheckOnly
    from loopnet.training.cli import build
    from loopnet.training.defaults import CALLBACK_GROUPS

    for subcommand in ("fit", "validate", "test", "predict"):
        got = {}

        class Capture(CheckOnly):
            def before_instantiate_classes(self) -> None:  # the parser only (no run folder looked up)
                got["parser"] = self.parser._subcommands_action._name_parser_map[self.subcommand]

        args = [subcommand, *CPU] + ([] if subcommand == "fit" else ["--ckpt_path", "last"])
        with redirect_stderr(io.StringIO()):
            build(args, Capture)
        ours = {a.dest: a for a in early.parser(subcommand)._actions}
        theirs = {a.dest: a for a in got["parser"]._actions}
        mapped = ("trainer", *CALLBACK_GROUPS)
        utility = ("help", "config", "print_config", "print_shtab")  # the parsers' own, not settings
        assert {d for d in ours if d.split(".")[0] not in mapped and d not in utility} == {
            d for d in theirs if d.split(".")[0] not in mapped and d not in utility
        }
        assert {d.split(".")[0] for d in theirs} >= set(mapped)
        differ = [
            (
                dest,
                getattr(action, "_typehint", None),
                getattr(theirs[dest], "_typehint", None),
                action.default,
                theirs[dest].default,
            )
            for dest, action in ours.items()
            if dest.split(".")[0] not in mapped
            and dest not in utility
            and (
                getattr(action, "_typehint", None) != getattr(theirs[dest], "_typehint", None)
                or action.default != theirs[dest].default
            )
        ]
        assert differ == [], subcommand


def test_a_bad_value_in_an_included_config_is_refused_before_lightning(folder):
    import subprocess

    from tests.reliability.helpers import env

    code = (
        "import sys\nfrom loopnet.commands import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print('lightning' in sys.modules, e.code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "fit", *CPU, "--config", "outer.yaml"],
        env=env(),
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    assert proc.stdout.split() == ["False", "2"], proc.stderr[-3000:]
    assert "LoopConfig.n_rounds must be >= 1, got 0" in proc.stderr


def test_the_subcommand_names_are_lightningclis():
    from lightning.pytorch.cli import LightningCLI

    from loopnet.training.subcommands import EVALUATION, READ_DATA, SUBCOMMANDS

    assert tuple(SUBCOMMANDS) == tuple(LightningCLI.subcommands())
    assert set(EVALUATION) | set(READ_DATA) == set(SUBCOMMANDS)
