"""`loopnet export CKPT OUT`: a checkpoint's model in the Hugging Face layout (`loopnet.formats.hf`).

    loopnet export runs/<run>/version_0/checkpoints/last.ckpt exported/ [--dtype bfloat16] [--overwrite]
"""

from __future__ import annotations

import argparse

from loopnet.env import one_line_errors


def parser() -> argparse.ArgumentParser:
    from loopnet.formats.hf import DTYPES, MAX_SHARD_SIZE

    p = argparse.ArgumentParser(prog="loopnet export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt", help="a loopnet checkpoint: a .ckpt file, or a sharded (FSDP) checkpoint folder")
    p.add_argument("out", help="the folder to write (new or empty, unless --overwrite)")
    p.add_argument("--dtype", default="float32", help=f"the weights' dtype: {', '.join(DTYPES)} (default float32)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists and is not empty")
    p.add_argument("--max_shard_size", default=MAX_SHARD_SIZE,
                   help=f"largest safetensors file before the weights are sharded (default {MAX_SHARD_SIZE})")
    return p


def main(argv: list[str] | None = None) -> None:
    from loopnet.formats import hf

    args = parser().parse_args(argv)
    with one_line_errors("loopnet export", (ValueError, FileNotFoundError)):
        out = hf.export(args.ckpt, args.out, dtype=args.dtype, overwrite=args.overwrite,
                        max_shard_size=args.max_shard_size)
    print(f"exported {args.ckpt} to {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")
