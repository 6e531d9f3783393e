"""`python -m loopnet.study.report` is `loopnet report`."""

from .build import main

main()
