#!/usr/bin/env bash
# The GPU check, run on a machine with one or more GPUs (docs/gpu-check.md).
# Here, once:   make device-wheels   (cp312 wheels, into .whl/, of what the GPU image lacks against its recorded
#                                     versions, scripts/gpu_image.json; it checks that they fit the 64 MiB carry)
# There, in one call of the device tool:  bash scripts/gpu_check.sh   with carry [".whl"], timeout_s 600.
# It runs on the image's torch. Its time is one budget, 590 s (scripts/gpu_check.py: BUDGET_S), from which
# every limit below and each check's is derived: the carried wheels' install, the preflight (versions, every
# requirement met, loopnet's imports), then the checks of scripts/gpu_check.py, MFU first: MFU at GPT-2-small
# width (d = 768, T = 1024) with compile off and on; the fp32 custom loss (the training head's one-softmax loss)
# against F.cross_entropy; bf16 vs fp32 loss over 50 steps; resume at step 10; FSDP (configs/fsdp.yaml) on the
# GPUs present, resumed from its sharded checkpoint; a generated parquet corpus streamed, time to the first
# step; DDP on >= 2 GPUs when present. Each check's row is added to $OUT/table.md as it ends (a run stopped at
# its limit leaves the rows so far); logs and runs in $OUT. Exit 1 when a check failed.
# On a machine without a GPU:  bash scripts/gpu_check.sh --cpu-dry-run   (the same steps at toy size on the CPU).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

limits=$(python3 scripts/gpu_check.py --shell-budget "$@") || exit 1
eval "$limits"  # INSTALL_S PREFLIGHT_S STEPS_S KILL_GRACE_S
echo "gpu_check: limits (s): install $INSTALL_S, preflight $PREFLIGHT_S, checks $STEPS_S" | tee "$OUT/versions.txt"

if compgen -G ".whl/*.whl" >/dev/null; then
    timeout "$INSTALL_S" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "gpu_check: installing .whl/ failed (or took over $INSTALL_S s)"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
fi

# The preflight: the image's versions against scripts/gpu_image.json, every requirement of loopnet and of the
# carried wheels met (one line each when not, naming the fix), loopnet's modules imported, a GPU present.
timeout "$PREFLIGHT_S" bash -c '
python3 scripts/device_wheels.py check --site /tmp/site || exit 1
python3 - "$1" <<"PY"
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU")
for name in ("lightning", "torchmetrics", "datasets", "pyarrow", "fsspec", "huggingface_hub", "jsonargparse",
             "tiktoken", "tensorboard", "matplotlib"):
    print(f"  {name} {md.version(name)}")
import loopnet.training.cli, loopnet.training.defaults, loopnet.diagnostics.callback  # noqa: F401,E401  (fails here, not half-way)
sys.exit(0 if torch.cuda.is_available() or int(sys.argv[1]) else 1)
PY
' preflight "$([[ " $* " == *" --cpu-dry-run "* ]] && echo 1 || echo 0)" 2>&1 | tee -a "$OUT/versions.txt" \
    || { echo "gpu_check: the preflight failed (or took over $PREFLIGHT_S s): $OUT/versions.txt"; exit 1; }

timeout -k "$KILL_GRACE_S" "$STEPS_S" python3 scripts/gpu_check.py --out "$OUT" "$@"
