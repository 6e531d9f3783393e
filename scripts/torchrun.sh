#!/usr/bin/env bash
# `loopnet fit` on one or several nodes with torchrun. Run this same command on every node; the extra
# arguments are loopnet fit's own (configs, overrides):
#
#   one node, all its GPUs:
#     bash scripts/torchrun.sh --config configs/deeploop_r6.yaml
#   two nodes of 8 GPUs, with FSDP (on each node; node0 is the host of the rendezvous):
#     NNODES=2 RDZV_HOST=node0 bash scripts/torchrun.sh --config configs/deeploop_r6.yaml --config configs/fsdp.yaml
#   on CPU, 2 processes (what tests/reliability/test_torchrun.py runs):
#     NPROC=2 ACCELERATOR=cpu STRATEGY=ddp bash scripts/torchrun.sh --config configs/deeploop_r6.yaml --config configs/cpu.yaml
#
# Every node must see the run folder at the same path: RUNS (default ./runs, made absolute) must be on a
# filesystem that all nodes mount. `--ckpt_path last` then resumes the run on every node; a node that does
# not see the folder stops the job with one line saying so (docs/scaling-out.md).
set -euo pipefail

NNODES=${NNODES:-1}                  # nodes in the job
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}  # processes per node: one per GPU
NPROC=$(( NPROC > 0 ? NPROC : 1 ))
RUNS=$(realpath -m "${RUNS:-runs}")  # the run folder's parent, on the shared filesystem
PYTHON=${PYTHON:-python3}

if (( NNODES > 1 )); then            # the c10d rendezvous on RDZV_HOST: no node rank to hand out
    : "${RDZV_HOST:?set RDZV_HOST to the host name of one of the nodes (the same on every node)}"
    launch=(--nnodes "$NNODES" --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:${RDZV_PORT:-29400}"
            --rdzv-id "${RDZV_ID:-loopnet}")
else
    launch=(--standalone)            # one node: a free local port
fi

# loopnet's arguments first: what the launch fixes (nodes, processes per node, the run folder) comes after
# them and wins over a config's (configs/cpu.yaml says devices: 1).
exec "$PYTHON" -m torch.distributed.run "${launch[@]}" --nproc_per_node "$NPROC" \
    -m loopnet.training.cli fit "$@" \
    --trainer.num_nodes "$NNODES" --trainer.devices "$NPROC" \
    ${ACCELERATOR:+--trainer.accelerator "$ACCELERATOR"} \
    ${STRATEGY:+--trainer.strategy "$STRATEGY"} \
    --trainer.logger.init_args.save_dir "$RUNS"
