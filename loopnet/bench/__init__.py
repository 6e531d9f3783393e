"""`loopnet bench` and the other benchmarks.

run              loopnet bench: the phases and the command line (python -m loopnet.bench)
settings         sizes per device, the batches; variants: the loops timed; peak: MFU's FLOP/s;
memory           memory of one step; targets: each target once, and the checks; report: markdown
data_throughput  the data pipeline alone (python -m loopnet.bench.data_throughput)
parity, nanogpt  loopnet's Pre-LN against an independent nanoGPT-style GPT (python -m loopnet.bench.parity)
"""
