#!/usr/bin/env bash
# The GPU check, run on a machine with one or more GPUs (docs/gpu-check.md).
# Here, once:   make device-wheels        (cp312 wheels, into .whl/, of what the device image lacks or
#                                          holds at versions older than datasets 5.2 needs: pyarrow, fsspec)
# There, in one call of the device tool:  bash scripts/gpu_check.sh   with carry [".whl"], timeout_s 540.
# It runs (budget: <= 8 min on one H200; each step has its own time limit) the checks of scripts/gpu_check.py,
# each a real `loopnet fit` or a short script: bf16 vs fp32 loss over 50 steps; the fp32 custom loss (the training
# head's one-softmax loss) against F.cross_entropy; DDP on >= 2 GPUs when present; FSDP (configs/fsdp.yaml) on
# the GPUs present, resumed from its sharded checkpoint; a generated parquet corpus streamed, time to the first
# step; resume at step 10; MFU at GPT-2-small width (d = 768, T = 1024) with compile off and on. It prints one
# table (also $OUT/table.md; logs and runs in $OUT) and exits 1 when a check failed.
# On a machine without a GPU:  bash scripts/gpu_check.sh --cpu-dry-run   (the same steps at toy size on the CPU).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
DRY=0; [[ " $* " == *" --cpu-dry-run "* ]] && DRY=1
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
# The image's own versions, before anything carried shadows them: was the carry needed?
import importlib.metadata as md
found = []
for name in ("datasets", "pyarrow", "fsspec", "jsonargparse", "lightning"):
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        found.append(f"{name} absent")
print("image:", ", ".join(found))
PY
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_check: installing .whl/ failed"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
fi

timeout -k 10 30 python3 - "$DRY" <<'PY' 2>&1 | tee -a "$OUT/versions.txt" || exit 1
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU")
for name in ("lightning", "torchmetrics", "datasets", "pyarrow", "fsspec", "huggingface_hub", "jsonargparse",
             "tiktoken", "tensorboard"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} MISSING: add it to DEVICE_WHEELS in the Makefile")
try:  # optional here: without it the depth-profile image is off (one warning), everything else runs
    print(f"  matplotlib {md.version('matplotlib')}")
except md.PackageNotFoundError:
    print("  matplotlib missing: no depth-profile image in TensorBoard (its wheels would not fit in .whl/)")
import loopnet.training.cli, loopnet.training.defaults, loopnet.diagnostics.callback  # noqa: F401,E401  (fails here, not half-way, if anything is missing)
sys.exit(0 if torch.cuda.is_available() or int(sys.argv[1]) else 1)
PY

timeout -k 10 480 python3 scripts/gpu_check.py --out "$OUT" "$@"
