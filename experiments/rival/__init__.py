"""The rival rule (docs/results/rival/README.md, section 1): its readings from the committed cells."""
