"""Default callbacks of the loopnet application, configured from YAML by the CLI."""

from __future__ import annotations

import os
import signal
import sys
import threading

from lightning.pytorch.callbacks import OnExceptionCheckpoint, ThroughputMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException


def _sequences(batch) -> int:
    return batch[0].size(0)


def _tokens(batch) -> int:
    return batch[0].numel()


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor for (inputs, targets) token batches: reports sequences/s,
    tokens/s and, where the device's peak is known, MFU from `LoopedLM.flops_per_batch`.

    Args:
        window_size: Number of batches the rolling averages cover.
    """

    def __init__(self, window_size: int = 50):
        super().__init__(batch_size_fn=_sequences, length_fn=_tokens, window_size=window_size)


class GracefulInterrupt(OnExceptionCheckpoint):
    """Make Ctrl-C (SIGINT) and SIGTERM stop training cleanly with a resumable checkpoint.

    Lightning already turns SIGTERM into a stop at the end of the current batch; the first
    SIGINT is routed to that same path (a second one interrupts at once). The checkpoint,
    `last-interrupted.ckpt` beside `last.ckpt`, is written only for these interruptions, never for
    a crash in the middle of a step; being named `last*`, Lightning's `--ckpt_path last` picks the
    newer of the two.

    Args:
        filename: Name of the checkpoint written on interruption (without .ckpt).
    """

    def __init__(self, filename: str = "last-interrupted"):
        super().__init__(dirpath=".", filename=filename)  # the real folder is set at fit start
        self._previous_sigint, self._armed = None, False

    @property
    def ckpt_path(self) -> str | None:
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION) if self._armed else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Runs after ModelCheckpoint.setup (checkpoint callbacks keep their order), which resolved its folder.
        if stage != "fit" or trainer.checkpoint_callback is None or not trainer.checkpoint_callback.dirpath:
            return
        self.dirpath, self._armed = trainer.checkpoint_callback.dirpath, True
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        print("\nloopnet: interrupt received; stopping after this batch (Ctrl-C again to abort)", file=sys.stderr)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's own graceful-stop path

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._armed and isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # After a fit that completed, a stale interruption checkpoint is removed (by the parent)
        # so that `--ckpt_path last` means last.ckpt; other stages never touch files.
        if stage == "fit" and self._armed:
            super().teardown(trainer, pl_module)
        self._armed = False
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
