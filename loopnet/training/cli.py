"""The `loopnet` command: LightningCLI over `LoopedLM` and `TokenStreamDataModule`.

    loopnet fit  --config configs/deeploop_r6.yaml [--config configs/cpu.yaml]
    loopnet test --config ... --ckpt_path runs/<run>/version_0/checkpoints/last.ckpt
    loopnet predict --config ... --ckpt_path ... --model.generate.prompt "To be"

The Trainer subcommands only; `loopnet` itself (and its other tools) is `loopnet.commands`, which
imports this module when a Trainer subcommand is called; this module never imports it back.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import logging
import os
import re
import signal
import sys
import warnings
from pathlib import Path

from jsonargparse import Namespace
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from loopnet import checkpoints
from loopnet.data import TokenStreamDataModule
from loopnet.data.preflight import check_hub
from loopnet.data.vocab import N_VOCAB
from loopnet.diagnostics import DivergenceGuard
from loopnet.env import one_line_errors
from loopnet.files import atomic_write, check_run_folder, check_writable
from loopnet.model import RUN_SETTINGS, LoopConfig
from loopnet.model.scales import scheme_label
from loopnet.training.callbacks import AtomicCheckpointIO
from loopnet.training.console import guard_console
from loopnet.training.defaults import TRAINER_DEFAULTS, callbacks
from loopnet.training.precheck import max_steps_problem, normalize_argv, precheck
from loopnet.training.module import LoopedLM
from loopnet.training.shared_folder import ResumeOnEveryRank, absolute


class _NoAdvert(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_dependencies() -> None:
    """What the libraries print on every command that says nothing about the user's run: Lightning's
    litlogger advert, its own use of APIs that torch and jsonargparse deprecated (warnings meant for
    Lightning's developers). Lightning's messages about the run itself stay."""
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")  # inherited by DDP's worker processes
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoAdvert())


quiet_dependencies()


# How run_name writes a model field that differs from LoopConfig's default ({} is its value); fields
# not listed read `<field>-<value>`. Run settings (model.config.RUN_SETTINGS) never name a run.
RUN_NAME_FIELDS = {"n_heads": "h{}", "seq_len": "ctx{}", "vocab_size": "v{}", "mlp_ratio": "mlp{}",
                   "positions": "{}", "norm": "{}", "bias": "bias", "tie_embeddings": "untied",
                   "input_norm": "input_norm", "sandwich": "sandwich"}


def run_name(config) -> str:
    """The run folder's name: the scheme, wiring, K, R and width, then every other model field that is not
    LoopConfig's default, e.g. ``deeploop_carry_k2_r6_d128_h4_ctx128`` (configs/cpu.yaml). Models that
    cannot resume each other's checkpoints (`checkpoints.check_checkpoint_config`) never share a folder,
    so `--ckpt_path last` finds only this model's runs. `config`: the model config (a Namespace or dict)."""
    config = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    name = [scheme_label(config["residual"], config.get("p")), config["wiring"], f"k{config['n_blocks']}",
            f"r{config['n_rounds']}", f"d{config['d_model']}"]
    named = {"residual", "p", "wiring", "n_blocks", "n_rounds", "d_model", *RUN_SETTINGS}
    order = list(RUN_NAME_FIELDS)
    for field in sorted(dataclasses.fields(LoopConfig), key=lambda f: order.index(f.name) if f.name in order else len(order)):
        value = config.get(field.name, field.default)
        if field.name not in named and value != field.default:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            name.append(RUN_NAME_FIELDS.get(field.name, f"{field.name}-{{}}").format(text))
    return "_".join(name)


def check_vocab_size(model_vocab: int, data_vocab: int, vocab: str) -> None:
    """The data's token ids must fit the model's embedding (else an IndexError in the first step)."""
    if model_vocab < data_vocab:
        raise ValueError(f"model.config.vocab_size={model_vocab} is smaller than the data's {data_vocab} token ids "
                         f"(data.vocab: {vocab}); fix: set model.config.vocab_size to at least {data_vocab} "
                         f"(a multiple of 64 is fastest, e.g. {-(-data_vocab // 64) * 64})"
                         + ("" if vocab == "compact" else ", or use data.vocab: compact"))


def check_run_settings(subcommand: str | None, cfg: Namespace) -> None:
    """Settings that cannot work, refused before anything is built or written."""
    problem = max_steps_problem(subcommand, cfg.trainer.get("max_steps"))
    if problem:
        raise ValueError(problem)
    data = cfg.get("data")
    if data is not None and data.get("vocab", "gpt2") == "gpt2":  # a compact vocabulary's size is known later
        check_vocab_size(cfg.model.config.vocab_size, N_VOCAB, "gpt2")


class OneLineErrorParser(LightningArgumentParser):
    """jsonargparse's parser, but a command-line or config error is one line on stderr (the problem
    and the fix) instead of the whole usage text; exit status 2 as before. Option names must be given
    whole: a prefix (`--model.config.n_round`) is an unknown option, not an abbreviation."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("LOOPNET_DEBUG"):
            super().error(message, ex)  # raises: jsonargparse's internal parsing relies on it
        text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
        if len(text) > 400:
            text = text[:400] + " ..."
        print(f"loopnet: error: {text}; fix: {self._hint(message, ex)}", file=sys.stderr)
        sys.exit(2)

    def _hint(self, message: str, ex: Exception | None) -> str:
        parser = getattr(ex, "subcommand_parser", None) or self
        sub = parser.prog.split()[-1] if parser.prog else ""
        prog = "loopnet" + (f" {sub}" if sub in ("fit", "validate", "test", "predict") else "")
        help_ = f"`{prog} --help` lists every option and its type"
        unknown = re.search(r"does not accept option '([^']+)'|unrecognized arguments: --?([^\s=]+)", message)
        if unknown:
            key = unknown.group(1) or unknown.group(2)
            parent, _, leaf = key.rpartition(".")
            siblings = {a.dest.rpartition(".")[2]: a.dest for a in parser._actions
                        if isinstance(a.dest, str) and a.dest.rpartition(".")[0] == parent}
            close = [siblings[k] for k in difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.75)]
            return (f"did you mean '{close[0]}'? " if close else "check the key's spelling and nesting; ") + help_
        if "File does not exist" in message:
            return "check the path given with --config (relative paths start from the current folder)"
        if "Problems parsing config" in message or "Unable to load config" in message:
            return "give an existing YAML file with --config, valid YAML; " + help_
        if "Expected a" in message or "Does not validate" in message or "not a valid" in message.lower():
            return "give the option a value of the expected type; " + help_
        return help_


class SaveConfigOnStart(SaveConfigCallback):
    """LightningCLI's config.yaml beside the logs, with guards for what is already there:
    a `fit` from a checkpoint writes it when training starts, after the checkpoint's state was
    restored, so a resume refused at the restore leaves the run's config.yaml as it was (Lightning
    writes it in `setup`, before the restore); `validate`/`test`/`predict` write `<stage>_config.yaml`,
    so one pinned to a fit's folder (--trainer.logger.init_args.version) never replaces its config;
    a symbolic link in the file's place is replaced, never written through."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            self.config_filename = f"{getattr(stage, 'value', stage)}_config.yaml"  # TrainerFn is a str enum
            self._save(trainer, pl_module, stage)
        elif not self.config.get("ckpt_path"):  # the CLI's config: is this fit a resume?
            self._save(trainer, pl_module, stage)

    def on_train_start(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, "fit")  # a no-op when setup already wrote it

    def _save(self, trainer, pl_module, stage: str) -> None:
        if not self.already_saved:
            path = os.path.join(trainer.log_dir, self.config_filename)  # log_dir: every rank calls it
            if trainer.is_global_zero and os.path.islink(path):
                os.unlink(path)
        super().setup(trainer, pl_module, stage)


def check_fresh_version(cfg: Namespace) -> None:
    """A fit without --ckpt_path pinned (--trainer.logger.init_args.version) to a folder that holds a
    run would overwrite that run's config.yaml and summary.json: refused before anything is written."""
    logger = cfg.trainer.logger
    if not isinstance(logger, Namespace) or logger.init_args.get("version") in (None, ""):
        return
    folder = checkpoints.version_folder(logger.init_args)
    held = [name for name in ("config.yaml", "summary.json") if (folder / name).exists()]
    held += ["checkpoints"] if any(folder.glob("checkpoints/*.ckpt")) else []
    if held:
        raise ValueError(f"{folder} already holds a run ({', '.join(held)}), which a new fit there would overwrite; "
                         f"fix: resume it with --ckpt_path last, pin another version, or leave out "
                         f"--trainer.logger.init_args.version for a new one")


def evaluate_in_run_folder(cfg: Namespace, subcommand: str) -> None:
    """`validate`/`test`/`predict` log into the checkpoint's own version folder when it is one of
    this run name's (`<version>/<subcommand>/`, beside the fit's curves, no new `version_N`), or into a
    `<subcommand>/` sub-folder of the version pinned; never over the fit's own files."""
    logger = cfg.trainer.logger
    if not isinstance(logger, Namespace) or not logger.class_path.endswith("TensorBoardLogger"):
        return
    args = logger.init_args
    if args.get("version") is None and cfg.get("ckpt_path"):
        ckpt, root = Path(cfg.ckpt_path).absolute(), (Path(args.save_dir) / (args.get("name") or "")).absolute()
        if ckpt.parent.name == "checkpoints" and ckpt.parent.parent.parent == root:
            args.version = ckpt.parent.parent.name
    if args.get("version") is not None and args.get("sub_dir") is None:
        args.sub_dir = subcommand


# How gloo and NCCL report a peer process that died in the middle of a collective.
PEER_ERROR = re.compile(r"Connection (reset|closed) by peer|Broken pipe|remote process exited|NCCL communicator was "
                        r"aborted|DistNetworkError", re.IGNORECASE)


class PeerLost(RuntimeError):
    """A process of a multi-process run ended, and this one lost its connection to it."""


def peer_lost(trainer, err: BaseException) -> str | None:
    """One line for a collective that failed because a peer process ended (killed, out of memory), naming
    that rank when this process launched it (Lightning's launcher on rank 0), else the peer's address;
    None for any other error."""
    if trainer.world_size < 2 or not isinstance(err, RuntimeError) or not PEER_ERROR.search(str(err)):
        return None
    dead = []
    for local_rank, proc in enumerate(getattr(trainer.strategy.launcher, "procs", None) or [], start=1):
        code = proc.poll()
        if code not in (None, 0):
            how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
                else f"exit status {code}"
            dead.append(f"rank {local_rank + trainer.node_rank * trainer.num_devices} ({how})")
    peer = re.search(r"\[([^\]]+)\]:(\d+)", str(err))
    who = (" and ".join(dead) + " of this DDP run ended") if dead else \
        (f"a peer process of this DDP run ({peer.group(1)}:{peer.group(2)}) ended" if peer else
         "a peer process of this DDP run ended")
    return (f"{who}, and rank {trainer.global_rank} lost its connection at step {trainer.global_step} "
            f"({type(err).__name__}: {PEER_ERROR.search(str(err)).group(0)}); fix: see that rank's output for why it "
            f"ended (killed: out of memory? see `dmesg`), then run the same command with --ckpt_path last on every rank")


class LoopnetCLI(LightningCLI):
    def __init__(self, *args, **kwargs):
        argv = kwargs.get("args")
        argv = sys.argv[1:] if argv is None else argv
        # `loopnet fit ...` builds fit's parser alone: each subcommand's costs ~0.3 s of every start-up.
        every = LightningCLI.subcommands()
        self._only = argv[0] if isinstance(argv, (list, tuple)) and argv and argv[0] in every else None
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        every = LightningCLI.subcommands()
        return {self._only: every[self._only]} if getattr(self, "_only", None) else every

    def instantiate_classes(self) -> None:
        """Before anything is built: a fit pinned to a version folder (or resuming one) takes its lock,
        and checks again, now alone, that a fresh fit finds the folder free (`check_fresh_version`)."""
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        logger = cfg.trainer.logger
        if (self.subcommand == "fit" and rank_zero_only.rank == 0 and isinstance(logger, Namespace)
                and logger.init_args.get("version") not in (None, "")):
            checkpoints.lock_version(checkpoints.version_folder(logger.init_args))
            if not cfg.ckpt_path:
                check_fresh_version(cfg)
        super().instantiate_classes()

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        # Checkpoints are written atomically (temporary file in the same folder, fsync, rename),
        # unless a CheckpointIO plugin was configured.
        strategy = trainer.strategy
        if strategy._checkpoint_io is None or type(strategy._checkpoint_io) is TorchCheckpointIO:
            strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.config.seq_len", "data.seq_len")
        for group, (cls, defaults) in callbacks().items():
            parser.add_lightning_class_args(cls, group)
            parser.set_defaults({f"{group}.{k}": v for k, v in defaults.items()})

    def _parse_ckpt_path(self) -> None:
        """Check `--ckpt_path` before anything is built. Unlike LightningCLI's default, the
        checkpoint's hyperparameters do not silently replace the given config: the model config
        must match (else a clear error), and evaluation settings (eval_rounds, generate) stay
        those of the command line."""
        if not self.config.get("subcommand"):
            return
        sub = self.config.subcommand
        cfg = self.config[sub]
        path = cfg.get("ckpt_path")
        if sub in EVALUATION and not path:
            raise ValueError(f"`loopnet {sub}` needs --ckpt_path: without one it would run the model with its "
                             f"random initial weights; fix: --ckpt_path runs/<run>/version_N/checkpoints/last.ckpt "
                             f"(or a best-*.ckpt), or 'last' for the newest last.ckpt of this config's run")
        if sub in EVALUATION and path in ("best", "hpc"):
            raise ValueError(f"--ckpt_path {path} names a checkpoint of a fit in this process, which `loopnet {sub}` "
                             f"does not have; fix: give the .ckpt file (runs/<run>/version_N/checkpoints/best-*.ckpt) "
                             f"or 'last'")
        if not path or path in ("last", "best", "hpc"):
            return
        checkpoints.check_checkpoint_file(path)
        self._check_checkpoint(path, cfg, sub)

    @staticmethod
    def _check_checkpoint(path: str, cfg: Namespace, subcommand: str) -> None:
        """The checks a checkpoint passes before anything is built: readable plain data, the same model
        config and, to resume a fit, the same data stream."""
        ckpt = checkpoints.check_checkpoint(path, cfg.model.config.as_dict())
        saved = TokenStreamDataModule.saved_config(ckpt)
        if subcommand == "fit" and saved is not None:
            TokenStreamDataModule(**cfg.data.as_dict()).check_resume(saved, f"the checkpoint {path}")

    def before_fit(self) -> None:
        self._check_data(train=True)
        if self.config.fit.get("ckpt_path"):  # a resume continues in its own checkpoint folder, as it should
            warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")

    def fit(self, **kwargs) -> None:
        """`trainer.fit`; one that fails before its first step completes removes the empty run folder it
        created, saying so in one line (`loopnet.training.failed_start`), and the error goes on as before."""
        from loopnet.training.failed_start import existing_log_folders, remove_failed_start

        existed = existing_log_folders(self.trainer)
        if getattr(self, "_resume_last", None) is not None:  # --ckpt_path last: every rank resumes, or none
            self.trainer.callbacks.insert(0, ResumeOnEveryRank(*self._resume_last))  # its setup first
        try:
            self.trainer.fit(**kwargs)
        except Exception as err:
            try:
                remove_failed_start(self.trainer, existed, err)
            except Exception as cleanup:  # the fit's own error is the one to show
                print(f"loopnet: could not remove the failed start's run folder ({cleanup})", file=sys.stderr)
            lost = peer_lost(self.trainer, err)
            if lost:
                raise PeerLost(lost) from err
            raise

    def after_fit(self) -> None:
        """Where the run went: one line each for its folder, checkpoints and summary (rank 0)."""
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        ckpt, guard = trainer.checkpoint_callback, next(
            (cb for cb in trainer.callbacks if isinstance(cb, DivergenceGuard)), None)
        logger = trainer.loggers[0] if trainer.loggers else None
        lines = []
        if logger is not None and logger.log_dir:
            lines.append(f"run folder: {logger.log_dir} (curves: tensorboard --logdir {logger.save_dir})")
        if isinstance(ckpt, ModelCheckpoint) and (ckpt.last_model_path or ckpt.best_model_path):
            last = ckpt.last_model_path or "none"
            lines.append(f"checkpoints: last {last}, best {ckpt.best_model_path or 'none'}")
        if guard is not None and guard.summary_path:
            lines.append(f"summary: {guard.summary_path}")
        for line in lines:
            print(f"loopnet: {line}", file=sys.stderr)

    def before_validate(self) -> None:
        self._check_data(train=False)

    def before_test(self) -> None:
        self._check_data(train=False)

    def _check_data(self, train: bool) -> None:
        """Built, not yet run, nothing written: read the corpus as the first steps would (empty, binary,
        too small, hub out of reach: a one-line error now instead of a run folder with an 'interrupted'
        summary), and check a compact vocabulary's size against the model's (known only now)."""
        self.datamodule.check(self.trainer.global_rank, self.trainer.world_size, train=train)
        check_vocab_size(self.model.config.vocab_size, self.datamodule.vocab_size, self.datamodule.vocab)

    def predict(self, **kwargs) -> None:
        """`loopnet predict`: the generated text on stdout once the progress bar is gone, and saved as
        `predictions.txt` in the run's log folder (rank 0)."""
        texts = [t for batch in self.trainer.predict(**kwargs) or [] for t in ([batch] if isinstance(batch, str) else batch)]
        if not self.trainer.is_global_zero:
            return
        for text in texts:
            print(text)
        log_dir = self.trainer.loggers[0].log_dir if self.trainer.loggers else None
        if log_dir:
            path = atomic_write(Path(log_dir) / "predictions.txt", lambda f: f.write("\n".join(texts) + "\n"),
                                binary=False)
            print(f"loopnet: saved the generated text to {path}", file=sys.stderr)

    def before_predict(self) -> None:
        # The prompt comes from LoopedLM.predict_dataloader (model.generate), not from the corpus. A model
        # trained on a compact vocabulary (the corpus's own ids) maps text to ids and back through it.
        dm, self.datamodule = self.datamodule, None
        trained = (checkpoints.load_checkpoint_meta(self.config.predict.ckpt_path).get("datamodule_hyper_parameters")
                   or {})
        if trained.get("vocab", "gpt2") != "gpt2" or (dm is not None and dm.vocab != "gpt2"):
            keys = ("vocab", "source", "path", "name", "split", "text_column")
            saved, given = ({k: hp.get(k) for k in keys} for hp in (trained, dict(dm.hparams) if dm else {}))
            if saved != given:
                diff = "; ".join(f"{k}: checkpoint {saved[k]!r} vs config {given[k]!r}" for k in keys if saved[k] != given[k])
                raise ValueError(f"{self.config.predict.ckpt_path} was trained on a compact vocabulary (the token ids "
                                 f"of its corpus), which this command's data settings do not rebuild ({diff}); fix: "
                                 f"give the data settings it was trained with (its config.yaml, e.g. "
                                 f"--config configs/study_cpu.yaml)")
            check_vocab_size(self.model.config.vocab_size, dm.vocab_size, dm.vocab)
            self.model.vocabulary = dm  # LoopedLM._tokens: text <-> the corpus's ids

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config  # run=False: no subcommand
        LoopConfig(**cfg.model.config.as_dict())  # a bad model config fails here with its own message
        check_run_settings(self.subcommand, cfg)
        logger = cfg.trainer.logger
        if isinstance(logger, Namespace) and logger.class_path.endswith("TensorBoardLogger"):
            if logger.init_args.get("name") in (None, "lightning_logs"):
                logger.init_args.name = run_name(cfg.model.config)
        if isinstance(logger, Namespace) and logger.class_path.endswith(("TensorBoardLogger", "CSVLogger")):
            check_run_folder(*(logger.init_args.get(k) for k in ("save_dir", "name", "version", "sub_dir")))
        if isinstance(logger, Namespace) and logger.init_args.get("save_dir") is not None:
            check_writable(logger.init_args.save_dir, "--trainer.logger.init_args.save_dir")
            # Absolute: the same run folder on every node (shared filesystem), and so recorded in config.yaml.
            logger.init_args.save_dir = absolute(logger.init_args.save_dir)
        elif logger is not False and cfg.trainer.get("default_root_dir"):
            check_writable(cfg.trainer.default_root_dir, "--trainer.default_root_dir")
        if self.subcommand == "fit" and cfg.get("checkpoint") and cfg.checkpoint.get("dirpath"):
            check_writable(cfg.checkpoint.dirpath, "--checkpoint.dirpath")
            cfg.checkpoint.dirpath = absolute(cfg.checkpoint.dirpath)
        if self.subcommand == "fit" and cfg.ckpt_path == "last":
            if isinstance(logger, Namespace):
                checkpoints.resume_in_last_version(logger.init_args)
            self._check_last_checkpoint(cfg)
            # What this rank found; the ranks compare once the process group is up (shared_folder.py).
            folder = checkpoints.pinned_checkpoint_folder(cfg)
            where = str(folder) if folder is not None else (
                f"{logger.init_args.save_dir}/{logger.init_args.get('name') or ''}" if isinstance(logger, Namespace)
                else "the checkpoint folder")
            self._resume_last = (None if cfg.ckpt_path == "last" else cfg.ckpt_path, where)
        if self.subcommand in EVALUATION and cfg.ckpt_path == "last":
            cfg.ckpt_path = self._newest_run_checkpoint(cfg)
        if self.subcommand in EVALUATION:
            evaluate_in_run_folder(cfg, self.subcommand)
        if self.subcommand == "fit" and not cfg.ckpt_path:
            check_fresh_version(cfg)
        # Checkpoints are loaded with torch's restricted (weights_only) unpickler unless asked otherwise.
        if "weights_only" in cfg and cfg.weights_only is None:
            cfg.weights_only = True

    def _check_last_checkpoint(self, cfg: Namespace) -> None:
        """`fit --ckpt_path last`: check the checkpoint Lightning will pick as a given path is
        checked (readable, plain data, same model config), and name it explicitly."""
        folder = checkpoints.pinned_checkpoint_folder(cfg)
        last = checkpoints.newest_last_checkpoint(folder) if folder is not None else None
        if last is not None:
            self._check_checkpoint(str(last), cfg, "fit")
            cfg.ckpt_path = str(last)
            if rank_zero_only.rank == 0:
                print(f"loopnet: resuming from {last}", file=sys.stderr)

    def _newest_run_checkpoint(self, cfg: Namespace) -> str:
        """`test`/`validate`/`predict --ckpt_path last`: the newest last*.ckpt of this config's run, in
        --checkpoint.dirpath or the logger's pinned version when given, else in its one version that
        holds checkpoints (several: refused as ambiguous)
        (Lightning's own 'last' would look in this evaluation's new folder, find none and quietly
        use the random initial weights)."""
        found, where = checkpoints.last_checkpoint(cfg)
        if found is None:
            raise FileNotFoundError(f"--ckpt_path last: no {where}; fix: give the .ckpt file with --ckpt_path, "
                                    f"or use the config (and run name) the model was trained with")
        self._check_checkpoint(str(found), cfg, self.subcommand)
        if rank_zero_only.rank == 0:
            print(f"loopnet: evaluating {found}", file=sys.stderr)
        return str(found)


# The Trainer entry points that evaluate a trained model: they need a checkpoint.
EVALUATION = ("validate", "test", "predict")


def main(args: list[str] | None = None, cli_class: type[LoopnetCLI] = LoopnetCLI, prechecked: bool = False) -> None:
    """The Trainer subcommands (fit, validate, test, predict) on `args` (default: the command line).
    `prechecked`: `loopnet` (loopnet.commands) already ran the checks that need no Lightning (precheck, the
    hub), so they are not run (nor the hub asked) twice."""
    argv = normalize_argv(sys.argv[1:] if args is None else list(args))
    if args is None:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself
    guard_console()  # a pipe whose reader goes away (`| tee`, Ctrl-C) never breaks the run
    try:
        if not prechecked:  # `python -m loopnet.training.cli` (sweep cells); `loopnet` ran these already
            with one_line_errors("loopnet", (ValueError, FileNotFoundError)):
                precheck(argv)
        with one_line_errors("loopnet", (ValueError, FileNotFoundError, PermissionError), debug=True):
            if not prechecked and cli_class is LoopnetCLI and argv and argv[0] in ("fit", "validate", "test"):
                check_hub(argv)  # `loopnet` itself did before importing Lightning
            cli_class(
                LoopedLM,
                TokenStreamDataModule,
                subclass_mode_model=False,
                subclass_mode_data=False,
                trainer_defaults=TRAINER_DEFAULTS,
                save_config_callback=SaveConfigOnStart,
                save_config_kwargs={"overwrite": True},
                auto_configure_optimizers=False,  # LoopedLM.configure_optimizers owns AdamW and the schedule
                parser_class=OneLineErrorParser,
                args=None if args is None else argv,
            )
    except PeerLost as err:  # a DDP rank died: one line, not gloo's multi-line traceback
        if os.environ.get("LOOPNET_DEBUG"):
            raise
        print(f"loopnet: error: {err}", file=sys.stderr)
        sys.exit(1)
    except OSError as err:  # disk full or over quota while writing a checkpoint or the run summary
        if err.errno not in (errno.ENOSPC, errno.EDQUOT) or os.environ.get("LOOPNET_DEBUG"):
            raise
        print(f"loopnet: error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before training started (during training GracefulInterrupt handles it)
        print("loopnet: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        checkpoints.release_version_locks()


if __name__ == "__main__":  # `python -m loopnet.training.cli fit ...`: the Trainer subcommands (sweep cells run it)
    main()
