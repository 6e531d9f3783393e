"""The Trainer subcommands of `loopnet` (LightningCLI's), by name: what each does, and which evaluate a
trained model. Light to import: `loopnet --help`, the early checks and the CLI read the names here."""

from __future__ import annotations

# name -> what it does (`loopnet --help`); LightningCLI's own subcommands, in its order.
SUBCOMMANDS = {
    "fit": "train: loopnet fit --config configs/deeploop_r6.yaml [--config configs/cpu.yaml]",
    "validate": "validation loss of a checkpoint (--ckpt_path FILE or last)",
    "test": "held-out loss of a checkpoint at its R and at each --model.eval_rounds R'",
    "predict": 'generate text from a checkpoint (--model.generate.prompt "ROMEO:")',
}

# The subcommands that evaluate a trained model: they need a checkpoint.
EVALUATION = ("validate", "test", "predict")

# The subcommands that read the corpus (predict reads the prompt instead).
READ_DATA = ("fit", "validate", "test")
