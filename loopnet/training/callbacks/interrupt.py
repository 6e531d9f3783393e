"""Ctrl-C and SIGTERM stop a fit cleanly, between steps, with a resumable checkpoint; a prediction, between
tokens, with the text generated so far."""

from __future__ import annotations

import copy
import os
import signal
import sys
import threading
from typing import Any

from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from loopnet import checkpoints
from loopnet.compat import rerun_validation, set_stop_flag
from loopnet.files import remove_stale_temporaries
from loopnet.training.console import pipe_broken, send_broken_output_to


class GracefulInterrupt(Checkpoint):
    """Make Ctrl-C (SIGINT), SIGTERM and SIGHUP (a closed terminal; not under nohup) stop training cleanly
    with a resumable checkpoint.

    Lightning already turns SIGTERM into a stop at the end of the current batch; the first
    SIGINT is routed to that same path (a second one aborts at once, without a checkpoint: it may
    land in the middle of an optimiser step; once the interruption checkpoint is being written, a
    further Ctrl-C only prints that it is, so the checkpoint is completed). The checkpoint,
    `last-interrupted.ckpt` beside `last.ckpt`, is written only for these stops between steps, never
    for a crash; being named `last*`, Lightning's `--ckpt_path last` picks the newer of the two. The process exits with
    status 0 (Lightning's SIGTERM path); a completed fit removes the stale interruption checkpoint unless
    it is newer than every checkpoint the fit keeps (a resume that ran no step past it).
    At fit start, temporary files that a kill during an earlier checkpoint write left in the
    checkpoint folder are removed. A reader of the run's output that goes away (`| tee` and Ctrl-C)
    neither breaks the run nor loses the checkpoint: the output goes to a file in the run folder and the
    run stops the same way (`loopnet.training.console`).

    A stop asked for during a validation abandons it after the current validation batch (a
    validation may take minutes, SLURM's grace before its kill is 30 s): the checkpoint holds the
    run as it was before that validation began, and the resumed run runs the validation again before
    its next step, so its record (TensorBoard, summary, best checkpoint) equals the uninterrupted
    run's. One during the sanity check (a few batches, before any step) waits for its end.

    `loopnet predict`: SIGINT, SIGTERM and SIGHUP set Lightning's stop flag (`trainer.received_sigterm`),
    which the generation asks before every token (`LoopedLM.predict_step`): it ends there, and the text
    generated so far is printed and saved as a complete prediction's is; the process exits 0. A second
    Ctrl-C aborts at once.

    Args:
        filename: Name of the checkpoint written on interruption (without .ckpt).
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, filename: str = "last-interrupted"):
        # Not an OnExceptionCheckpoint: Lightning turns a plain `fit` into `fit(ckpt_path="last")`
        # when one is present, so a fresh run would silently resume from an old folder's
        # checkpoint. ModelCheckpoint's `last` lookup finds `last-*.ckpt` files all the same.
        super().__init__()
        if not filename:
            raise ValueError("interrupt.filename cannot be empty")
        self.dirpath, self.filename = ".", filename  # the real folder is set at fit start
        self._previous_sigint, self._armed = None, False
        self._pending = False  # a signal arrived; the ranks agree on the stop at the end of a step or validation batch
        self._validated_at: int | None = None  # global step of the last validation (not the sanity check)
        self._after_validation = False  # the interruption checkpoint being written follows a validation
        self._abandoning = False  # the validation under way is being abandoned for a stop
        self._val_progress: dict | None = None  # the validation loop's progress before the validation under way
        self._rerun_at: int | None = None  # resumed from a stop that abandoned the validation of this step
        self._abandoned_step: int | None = (
            None  # the interruption checkpoint being written abandoned this step's validation
        )

    @property
    def ckpt_path(self) -> str | None:
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION) if self._armed else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Runs after ModelCheckpoint.setup (checkpoint callbacks keep their order), which resolved its folder.
        if stage != "fit" or trainer.checkpoint_callback is None or not trainer.checkpoint_callback.dirpath:
            return
        self.dirpath, self._armed = trainer.checkpoint_callback.dirpath, True
        if trainer.is_global_zero:  # what a kill during an earlier run's checkpoint write left
            remove_stale_temporaries(self.dirpath)
        send_broken_output_to(trainer.log_dir)  # (every rank: log_dir is a broadcast)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        print("\nloopnet: interrupt received; stopping after this batch (Ctrl-C again to abort)", file=sys.stderr)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGTERM)  # the SIGTERM path below

    # SIGTERM: Lightning's handler runs a collective (a broadcast from rank 0) inside the signal handler,
    # which under DDP hangs every rank when the signal reaches all of them (a terminal's Ctrl-C, SLURM,
    # Kubernetes, `timeout`) or a rank other than 0 alone. Here the handler only notes the signal; at
    # the end of every step and validation batch the ranks agree (one all-reduce of a flag) and all stop there.
    def _install_sigterm(self) -> None:
        if self._armed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)  # Lightning's teardown restores the original
            if (
                signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
            ):  # a closed terminal stops as SIGTERM (not under nohup)
                signal.signal(signal.SIGHUP, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self._pending = True

    def on_predict_start(self, trainer, pl_module) -> None:
        # After Lightning registered its own SIGTERM handler, which this replaces; its teardown restores them all.
        if threading.current_thread() is not threading.main_thread():
            return
        stops = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # (not under nohup)
            stops.append(signal.SIGHUP)

        def stop_generating(signum, frame) -> None:
            if signum == signal.SIGINT:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts
            if not trainer.received_sigterm and trainer.is_global_zero:
                print(
                    f"\nloopnet: {signal.Signals(signum).name} received; stopping the generation after this "
                    "token, the text so far is kept",
                    file=sys.stderr,
                )
            set_stop_flag(trainer)

        for signum in stops:
            signal.signal(signum, stop_generating)

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self._install_sigterm()  # after Lightning registered its own handler, which this replaces

    def _stop_agreed(self, trainer) -> bool:
        """Whether to stop now: a signal or a broken output pipe on any rank (one all-reduce of a flag)."""
        stop = self._pending or pipe_broken()
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        return stop

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._armed and self._stop_agreed(trainer):  # Lightning's own stop, on every rank after this same step
            set_stop_flag(trainer)

    # A stop during a validation abandons it. Lightning raises SIGTERMException after a validation batch
    # once `received_sigterm` is set (not after the last one: that validation completes, and the stop
    # follows the step as outside a validation). The interruption checkpoint then stores the validation
    # loop's progress as it was before this validation and this step's number (`state_dict`); the resumed
    # run enters Lightning's restart-in-the-middle-of-a-validation path, which runs the validation of
    # that step (all of it, it starts afresh) before the next training step.
    #
    # Except after the last step (max_steps): a resume would have no step left to run that validation
    # before (Lightning's fit loop is done), and the final weights would be only in the interruption
    # checkpoint, which the completed fit removes. That validation completes, and the run with it.
    def on_validation_start(self, trainer, pl_module) -> None:
        if not self._armed or trainer.sanity_checking:
            return
        self._val_progress = copy.deepcopy(trainer.fit_loop.epoch_loop.val_loop.batch_progress.state_dict())
        if trainer.received_sigterm:  # the ranks agreed to stop at this step's end
            if self._last_step(trainer):
                set_stop_flag(trainer, False)  # (Lightning would leave it after a batch)
                return
            self._abandoning = True
            raise SIGTERMException()  # before any of its batches

    def on_validation_batch_end(self, trainer, *args, **kwargs) -> None:
        if not self._armed:
            return
        if trainer.sanity_checking:
            # Stopped in the sanity check, Lightning would write a step-0 checkpoint whose resume shifts
            # every step: the stop waits for the first step (the ranks agree on it there).
            if trainer.received_sigterm:
                set_stop_flag(trainer, False)
                self._pending = True
            return
        if not self._last_step(trainer) and self._stop_agreed(trainer):  # (every rank skips the last step's alike)
            set_stop_flag(trainer)
            self._abandoning = True

    @staticmethod
    def _last_step(trainer) -> bool:
        return 0 <= trainer.max_steps <= trainer.global_step

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._validated_at, self._abandoning = trainer.global_step, False  # it completed

    def on_train_start(self, trainer, pl_module) -> None:
        self._install_sigterm()
        if self._rerun_at is not None and self._rerun_at == trainer.global_step:
            # Resumed between the step and its abandoned validation: fit_loop.reset, just before this hook,
            # worked the restart stage out from the progress counters, which cannot tell this validation
            # from one that completed (and would be skipped)
            rerun_validation(trainer)
        self._rerun_at = None

    def state_dict(self) -> dict[str, Any]:
        return {} if self._abandoned_step is None else {"rerun_validation_at": self._abandoned_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rerun_at = state_dict.get("rerun_validation_at")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self._abandoned_step is not None:  # the validation loop as it was before the validation abandoned
            checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"] = copy.deepcopy(self._val_progress)
        # Written after a validation, at the end of the step, the interruption checkpoint holds the
        # logger's step counter already advanced; resuming a checkpoint of a step that validated,
        # Lightning skips that validation and advances the counter once more (as for last.ckpt, written
        # at the validation, before the advance). Stored as last.ckpt has it, every resumed TensorBoard
        # point keeps its step. (An abandoned validation stops before the advance.)
        if self._after_validation:
            checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._armed and isinstance(exception, SIGTERMException):
            self._after_validation = self._validated_at == trainer.global_step
            self._abandoned_step = trainer.global_step if self._abandoning else None
            self._hold_sigint(say=trainer.is_global_zero)
            try:
                trainer.save_checkpoint(self.ckpt_path, weights_only=False)
            finally:
                self._after_validation, self._abandoned_step = False, None
                self._restore_sigint()  # (Lightning calls no teardown hook after an exception)
            if trainer.is_global_zero:
                from loopnet.diagnostics.summary import RunSummary

                RunSummary.of(trainer).name_last_checkpoint(self.ckpt_path)  # written before this checkpoint
                bar = "\n" if trainer.progress_bar_callback is not None else ""  # the bar's line has no end
                print(
                    f"{bar}loopnet: stopped at step {trainer.global_step}, saved {self.ckpt_path}; "
                    f"resume with {checkpoints.resume_hint()}",
                    file=sys.stderr,
                )

    # A Ctrl-C while the interruption checkpoint is written would abandon it (the stop would then leave
    # no checkpoint at all): held, with one line saying what is happening; the run ends moments later.
    def _hold_sigint(self, say: bool) -> None:
        if threading.current_thread() is threading.main_thread():
            self._say_saving = say  # rank 0 only: a terminal's Ctrl-C reaches every rank
            signal.signal(signal.SIGINT, self._on_sigint_while_saving)

    def _on_sigint_while_saving(self, signum, frame) -> None:
        if self._say_saving:
            print(
                f"\nloopnet: saving the interrupted checkpoint {self.ckpt_path}, please wait "
                "(the run then ends by itself)",
                file=sys.stderr,
            )

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # After a fit that completed, a stale interruption checkpoint is removed (by rank 0)
        # so that `--ckpt_path last` means last.ckpt; other stages never touch files.
        if stage == "fit" and self._armed:
            if checkpoints.newer_than_kept(self.ckpt_path, trainer):  # a resume that ran no step past it: kept
                if trainer.is_global_zero:
                    from loopnet.diagnostics.summary import RunSummary

                    RunSummary.of(trainer).name_last_checkpoint(self.ckpt_path)
            else:
                trainer.strategy.remove_checkpoint(self.ckpt_path)
        self._armed = False
        self._restore_sigint()

    def _restore_sigint(self) -> None:
        """The SIGINT handler from before the fit, back."""
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
