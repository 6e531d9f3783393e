"""`python -m loopnet <command> ...`: the `loopnet` command (`loopnet.commands`)."""

import sys

from loopnet.commands import main

if __name__ == "__main__":
    sys.argv[0] = "loopnet"  # the name usage lines show (not .../loopnet/__main__.py)
    main()
