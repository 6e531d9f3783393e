"""``python -m loopnet.eval --ckpt_path X --tasks arc_easy --rounds 1,3,6`` (same as ``loopnet eval``)."""

from loopnet.eval.cli import main

if __name__ == "__main__":
    main()
