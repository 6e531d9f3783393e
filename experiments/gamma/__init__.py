"""The depth exponent (docs/results/gamma/PREREGISTRATION.md): its readings and its long-check sweep file."""
