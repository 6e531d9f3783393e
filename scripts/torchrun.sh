#!/usr/bin/env bash
# `loopnet fit` on one or several nodes with torchrun. Run this same command on every node; the arguments
# are loopnet fit's own (configs, overrides), except the launcher's options below, which torchrun.sh takes:
#
#   one node, all its GPUs:
#     bash scripts/torchrun.sh --config configs/deeploop_r6.yaml
#   two nodes of 8 GPUs, with FSDP (on each node; node0 is the host of the rendezvous):
#     bash scripts/torchrun.sh --nnodes 2 --rdzv_host node0 --config configs/deeploop_r6.yaml --config configs/fsdp.yaml
#   on a machine without GPUs, 2 CPU processes (gloo; what tests/reliability/test_torchrun.py runs):
#     bash scripts/torchrun.sh --nproc_per_node 2 --config configs/deeploop_r6.yaml --config configs/cpu.yaml
#
# The launcher's options (each also an environment variable; an option wins):
#   --nproc_per_node N  (NPROC)     processes per node; default: one per GPU that `nvidia-smi -L` lists. Without
#                                   a GPU it must be given, and the processes run on the CPU (gloo).
#   --nnodes N          (NNODES)    nodes in the job, default 1
#   --rdzv_host HOST    (RDZV_HOST) the host of the c10d rendezvous, the same on every node (needed when N > 1);
#                                   RDZV_PORT (29400) and RDZV_ID (loopnet) complete it
#   --accelerator A     (ACCELERATOR), --strategy S (STRATEGY): loopnet's trainer settings, when given
#   --                              everything after it is loopnet's
# RUNS (default ./runs, made absolute) is the run folder's parent, PYTHON (python3) the interpreter.
#
# Every node must see the run folder at the same path: RUNS must be on a filesystem that all nodes mount.
# `--ckpt_path last` then resumes the run on every node; a node that does not see the folder stops the job
# with one line saying so (docs/scaling-out.md).
set -euo pipefail

NPROC=${NPROC:-}
NNODES=${NNODES:-1}
RDZV_HOST=${RDZV_HOST:-}
ACCELERATOR=${ACCELERATOR:-}
STRATEGY=${STRATEGY:-}
fail() { echo "torchrun.sh: $*" >&2; exit 2; }

loopnet_args=()
while (( $# )); do
    case $1 in
        --nproc_per_node|--nproc-per-node|--nnodes|--rdzv_host|--rdzv-host|--accelerator|--strategy)
            (( $# >= 2 )) || fail "$1 needs a value"
            name=$1 value=$2; shift 2 ;;
        --nproc_per_node=*|--nproc-per-node=*|--nnodes=*|--rdzv_host=*|--rdzv-host=*|--accelerator=*|--strategy=*)
            name=${1%%=*} value=${1#*=}; shift ;;
        --) shift; loopnet_args+=("$@"); break ;;
        *) loopnet_args+=("$1"); shift; continue ;;
    esac
    case $name in
        --nproc_per_node|--nproc-per-node) NPROC=$value ;;
        --nnodes) NNODES=$value ;;
        --rdzv_host|--rdzv-host) RDZV_HOST=$value ;;
        --accelerator) ACCELERATOR=$value ;;
        --strategy) STRATEGY=$value ;;
    esac
done
[[ $NNODES =~ ^[1-9][0-9]*$ ]] || fail "--nnodes must be a positive integer (got '$NNODES')"

# Processes per node: as given, else one per GPU. Without a GPU, the run needs an explicit count (CPU processes).
gpus=0
if command -v nvidia-smi >/dev/null; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [[ -z $NPROC ]]; then
    (( gpus > 0 )) || fail "needs GPUs (one process per GPU that 'nvidia-smi -L' lists; $(command -v nvidia-smi >/dev/null \
        && echo 'it lists none' || echo 'nvidia-smi is not on PATH')); fix: on GPUs, put nvidia-smi on PATH, or for CPU processes (gloo) give --nproc_per_node N"
    NPROC=$gpus
fi
[[ $NPROC =~ ^[1-9][0-9]*$ ]] || fail "--nproc_per_node must be a positive integer (got '$NPROC')"
if (( gpus == 0 )); then  # CPU processes: DDP over gloo unless told otherwise
    ACCELERATOR=${ACCELERATOR:-cpu}
    STRATEGY=${STRATEGY:-ddp}
fi
RUNS=$(realpath -m "${RUNS:-runs}")  # the run folder's parent, on the shared filesystem
PYTHON=${PYTHON:-python3}

if (( NNODES > 1 )); then            # the c10d rendezvous on RDZV_HOST: no node rank to hand out
    [[ -n $RDZV_HOST ]] || fail "--nnodes $NNODES needs --rdzv_host HOST (the host name of one of the nodes, the same on every node)"
    launch=(--nnodes "$NNODES" --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:${RDZV_PORT:-29400}"
            --rdzv-id "${RDZV_ID:-loopnet}")
else
    launch=(--standalone)            # one node: a free local port
fi

# loopnet's arguments first: what the launch fixes (nodes, processes per node, the run folder) comes after
# them and wins over a config's (configs/cpu.yaml says devices: 1).
exec "$PYTHON" -m torch.distributed.run "${launch[@]}" --nproc_per_node "$NPROC" \
    -m loopnet.training.cli fit ${loopnet_args[@]+"${loopnet_args[@]}"} \
    --trainer.num_nodes "$NNODES" --trainer.devices "$NPROC" \
    ${ACCELERATOR:+--trainer.accelerator "$ACCELERATOR"} \
    ${STRATEGY:+--trainer.strategy "$STRATEGY"} \
    --trainer.logger.init_args.save_dir "$RUNS"
