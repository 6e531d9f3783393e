"""The stability map (docs/results/map/README.md): its readings from the committed cells."""
