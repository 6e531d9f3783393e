"""The `loopnet` command's entry point, light to import: `loopnet --help` and the tools (`sweep`,
`report`, `probe`, `coordcheck`, `compare`, `eval`, `export`, `bench`) start without Lightning, whose import is
most of a command's start-up (3-4 s on a 2-core CPU); `fit`, `validate`, `test` and `predict` go on to
`loopnet.training.cli`."""

from __future__ import annotations

import sys

from loopnet.training.subcommands import READ_DATA, SUBCOMMANDS


def _sweep(argv: list[str]) -> None:
    from loopnet.study.sweep import main
    from loopnet.training.trust import take_flag

    main(take_flag(argv))  # --trust_config: the cells inherit LOOPNET_TRUST_CONFIG


def _report(argv: list[str]) -> None:
    from loopnet.study.report import main

    main(argv)


def _probe(argv: list[str]) -> None:
    from loopnet.study.probe import main

    main(argv)


def _coordcheck(argv: list[str]) -> None:
    from loopnet.diagnostics.coord_check import main

    main(argv)


def _compare(argv: list[str]) -> None:
    from loopnet.diagnostics.compare import main

    main(argv)


def _eval(argv: list[str]) -> None:
    from loopnet.eval.cli import main

    main(argv)


def _export(argv: list[str]) -> None:
    from loopnet.formats.cli import main

    main(argv)


def _bench(argv: list[str]) -> None:
    from loopnet.bench.run import main

    main(argv)


def _import(argv: list[str]) -> None:
    from loopnet.formats.cli import import_main

    import_main(argv)


def _retrofit(argv: list[str]) -> None:
    from loopnet.formats.cli import retrofit_main

    retrofit_main(argv)


# Subcommands that are not Trainer entry points, each with its own parser: name -> (entry point, what it does).
# Each is imported only when called, so that `loopnet fit` does not pay for the harness or matplotlib.
TOOLS = {
    "sweep": (_sweep, "run a grid of fits (resumable)"),
    "report": (_report, "turn a sweep folder into a markdown report with plots"),
    "probe": (_probe, "update size and κ̂ of the first AdamW steps over R and schemes"),
    "coordcheck": (_coordcheck, "mean |x| of every visit against width and R over the first steps (μP's check)"),
    "compare": (_compare, "overlay runs' depth profiles at chosen steps (PNG)"),
    "eval": (_eval, "downstream tasks through lm-evaluation-harness at several R'"),
    "export": (_export, "a checkpoint's model in the Hugging Face layout (safetensors, config.json, code)"),
    "bench": (_bench, "training throughput, MFU and memory benchmarks"),
    "import": (_import, "a released looped LM (Huginn) as a loopnet model folder"),
    "retrofit": (_retrofit, "a pretrained GPT-2 or Llama as a looped model by layer selection"),
}


def usage() -> str:
    rows = [*SUBCOMMANDS.items(), *((name, text) for name, (_, text) in TOOLS.items())]
    lines = [
        "usage: loopnet <command> [options]   (`loopnet <command> --help` lists the command's options)",
        "",
        "Train and study looped Transformers.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<9} {text}" for name, text in rows]
    return "\n".join(lines)


def main(args: list[str] | None = None) -> None:
    """Dispatch: a tool by name, else the Trainer subcommands (`loopnet.training.cli`, imported only
    then; it never imports this module back)."""
    from loopnet.compat import lean_torchmetrics

    lean_torchmetrics()  # whichever command imports Lightning: torchmetrics without its optional back-ends
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in TOOLS:
        return TOOLS[argv[0]][0](argv[1:])
    if argv in (["-h"], ["--help"]):
        print(usage())
        return
    if not argv:
        from loopnet.env import fail

        print(usage(), file=sys.stderr)
        fail(
            "loopnet",
            "no command given; fix: give one of the commands above, e.g. "
            "`loopnet fit --config configs/deeploop_r6.yaml`",
        )
    from loopnet.env import one_line_errors
    from loopnet.training.precheck import precheck
    from loopnet.training.trust import take_flag

    argv = take_flag(argv)  # --trust_config: recorded in the environment for every parse after this one
    if args is None:
        sys.argv[1:] = argv
    else:
        args = argv

    with one_line_errors("loopnet", (ValueError, FileNotFoundError)):
        settings = precheck(argv)  # a typo reported in a second, not after Lightning's import
    if settings is not None and argv[0] in READ_DATA:  # an unreachable hub said in seconds, not after Lightning's
        from loopnet.data.errors import DataConfigError
        from loopnet.data.hub_reachable import check_hub

        with one_line_errors("loopnet", (DataConfigError,)):
            check_hub(settings.data, argv)
    from loopnet.training.cli import main as trainer

    trainer(args, prechecked=True)  # args None: LightningCLI reads sys.argv itself
