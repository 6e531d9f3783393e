"""`loopnet` (and `python -m loopnet`): the Trainer subcommands (fit, validate, test, predict) go to
`loopnet.training.cli`; the tools below, each with its own parser, to their `main`. Each is imported
only when called, so that `loopnet fit` does not pay for the harness or matplotlib."""

from __future__ import annotations

import sys


def _sweep(argv: list[str]) -> None:
    from loopnet.study.sweep import main

    main(argv)


def _report(argv: list[str]) -> None:
    from loopnet.study.report import main

    main(argv)


def _probe(argv: list[str]) -> None:
    from loopnet.study.probe import main

    main(argv)


def _eval(argv: list[str]) -> None:
    from loopnet.eval.cli import main

    main(argv)


def _bench(argv: list[str]) -> None:
    from loopnet.bench.run import main

    main(argv)


# Subcommands that are not Trainer entry points: name -> (entry point, what it does).
TOOLS = {
    "sweep": (_sweep, "run a grid of fits (resumable)"),
    "report": (_report, "turn a sweep folder into a markdown report with plots"),
    "probe": (_probe, "update size and κ̂ of the first AdamW steps over R and schemes"),
    "eval": (_eval, "downstream tasks through lm-evaluation-harness at several R'"),
    "bench": (_bench, "training throughput, MFU and memory benchmarks"),
}


def main(args: list[str] | None = None, trainer=None) -> None:
    """`trainer`: the Trainer subcommands' entry point, when the caller already holds it."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in TOOLS:
        return TOOLS[argv[0]][0](argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        print("loopnet tools: " + "; ".join(f"{name}: {help}" for name, (_, help) in TOOLS.items()))
    if trainer is None:
        from loopnet.training.cli import main as trainer
    trainer(args)


if __name__ == "__main__":
    main()
