"""The stock lm-evaluation-harness command line, with the ``loopnet`` model registered.

The harness finds models only in modules that have been imported, so ``lm_eval --model loopnet``
alone cannot see ours; this runs the same CLI after importing the adapter:

    python -m loopnet.eval.harness run --model loopnet \\
        --model_args ckpt_path=runs/.../last.ckpt,rounds=3 --tasks arc_easy --device cpu
"""

import loopnet.eval.adapter  # noqa: F401  (registers "loopnet")
from lm_eval.__main__ import cli_evaluate

if __name__ == "__main__":
    cli_evaluate()
