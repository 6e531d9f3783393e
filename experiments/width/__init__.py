"""The width study (docs/results/rival/README.md, section 2): its readings from the committed cells."""
