#!/usr/bin/env bash
# The GPU check, for a session whose task is lent the GPU machine (README, "GPU check").
# Here, once:   make device-wheels        (cp312 wheels of what the device image lacks, into .whl/)
# There, in one call of the device tool:  bash scripts/gpu_check.sh   with carry [".whl"], timeout_s 600.
# It runs (~6-8 min on an H200): the versions it found; a 100-step `loopnet fit` at GPT-2-small width in
# bf16-mixed on the embedded corpus (fused AdamW, gradient clipping, TokenThroughput's MFU logged); then
# `loopnet bench` (GPU profile). Logs, bench.md and bench.json land in $OUT (the device tool brings them back).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_check: installing .whl/ failed"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
fi

python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt" || exit 1
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU")
for name in ("lightning", "torchmetrics", "datasets", "pyarrow", "fsspec", "huggingface_hub", "jsonargparse",
             "tiktoken", "tensorboard"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} MISSING: add it to DEVICE_WHEELS in the Makefile")
import loopnet.training.cli  # noqa: F401  (fails here, not half-way, if anything is missing)
sys.exit(0 if torch.cuda.is_available() else 1)
PY

echo "== loopnet fit: 100 steps, DeepLoop K=2 R=6, d=768, T=1024, batch 16, bf16-mixed, embedded corpus"
timeout 240 python3 -m loopnet.training.cli fit --config configs/deeploop_r6.yaml \
    --data.source shakespeare --data.path null --data.val_fraction null --data.val_max_tokens null \
    --trainer.max_steps 100 --trainer.val_check_interval 50 --trainer.limit_val_batches 4 \
    --trainer.log_every_n_steps 10 --trainer.default_root_dir /tmp/gpu_check_runs \
    --trainer.logger.init_args.save_dir /tmp/gpu_check_runs 2>&1 | tee "$OUT/fit.log" | grep -v -E '^\s*$' | tail -25
echo "fit exit status ${PIPESTATUS[0]}"
python3 - <<'PY' 2>&1 | tee -a "$OUT/fit.log"
# What TokenThroughput logged: tokens/s and MFU of the last logged steps.
import glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for path in sorted(glob.glob("/tmp/gpu_check_runs/**/events.out.tfevents.*", recursive=True)):
    ea = EventAccumulator(path, size_guidance={"scalars": 0}); ea.Reload()
    for tag in ea.Tags()["scalars"]:
        if any(k in tag for k in ("mfu", "tokens_per_sec", "loss")) and "visit" not in tag:
            ev = ea.Scalars(tag)
            print(f"{tag}: last {ev[-1].value:.4g} at step {ev[-1].step} ({len(ev)} points)")
PY

echo "== loopnet bench (GPU profile)"
timeout 420 python3 -m loopnet.bench --out "$OUT/bench.md" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -40
echo "bench exit status ${PIPESTATUS[0]}"
