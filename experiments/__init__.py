"""The studies' own code: what recomputes one study's pre-stated readings from its committed cells, and the
rules that write its follow-up sweep files. It builds on `loopnet` one way (loopnet never imports it) and runs
from the repository root (`python -m experiments.rival.readings ...`, the Makefile's study targets); it is not
part of the installed package. What several studies share: `sources` (their cells, read and grouped) and
`followup` (the rules that write their follow-up sweep files)."""
