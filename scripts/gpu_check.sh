#!/usr/bin/env bash
# The GPU check, for a session whose task is lent the GPU machine (README, "GPU check").
# Here, once:   make device-wheels        (cp312 wheels, into .whl/, of what the device image lacks or
#                                          holds at versions older than datasets 5.2 needs: pyarrow, fsspec)
# There, in one call of the device tool:  bash scripts/gpu_check.sh   with carry [".whl"], timeout_s 420.
# It runs (estimated ~5 min on an H200; inner limits 30 + 120 + 240 s): the versions it found; a 100-step `loopnet fit` at
# GPT-2-small width in bf16-mixed on the embedded corpus (fused AdamW, gradient clipping, TokenThroughput's
# tokens/s and MFU logged); then `loopnet bench` (GPU profile, 2 reps). versions.txt, fit.log, bench.log,
# bench.md and bench.json land in $OUT (the device tool brings them back). Exit status: the first failure's.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
RUNS=/tmp/gpu_check_runs
mkdir -p "$OUT"
rm -rf "$RUNS"  # a rerun on a warm machine must not mix in the last run's events
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

timeout -k 10 30 python3 - <<'PY' 2>&1 | tee -a "$OUT/versions.txt" || exit 1
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
sys.exit(0 if torch.cuda.is_available() else 1)
PY

echo "== loopnet fit: 100 steps, DeepLoop K=2 R=6, d=768, T=1024, batch 16, bf16-mixed, embedded corpus"
timeout -k 10 120 python3 -m loopnet.training.cli fit --config configs/deeploop_r6.yaml \
    --data.source shakespeare --data.path null --data.revision null --data.name null --data.val_fraction null --data.val_max_tokens null \
    --trainer.max_steps 100 --trainer.val_check_interval 50 --trainer.limit_val_batches 4 \
    --trainer.log_every_n_steps 10 --trainer.enable_progress_bar false --trainer.default_root_dir "$RUNS" \
    --trainer.logger.init_args.save_dir "$RUNS" 2>&1 | tee "$OUT/fit.log" | tail -25
fit_rc=${PIPESTATUS[0]}
echo "fit exit status $fit_rc"
python3 - "$RUNS" <<'PY' 2>&1 | tee -a "$OUT/fit.log"
# What the fit logged: loss, tokens/s and MFU (TokenThroughput is Lightning's ThroughputMonitor: items = tokens).
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for path in sorted(glob.glob(f"{sys.argv[1]}/**/events.out.tfevents.*", recursive=True)):
    ea = EventAccumulator(path, size_guidance={"scalars": 0}); ea.Reload()
    for tag in ea.Tags()["scalars"]:
        if any(k in tag for k in ("mfu", "items_per_sec", "loss")) and "visit" not in tag:
            ev = ea.Scalars(tag)
            print(f"{tag}: last {ev[-1].value:.4g} at step {ev[-1].step} ({len(ev)} points)")
PY

echo "== loopnet bench (GPU profile)"
timeout -k 10 240 python3 -m loopnet.bench --reps 2 --out "$OUT/bench.md" --json "$OUT/bench.json" 2>&1 \
    | tee "$OUT/bench.log" | tail -40
bench_rc=${PIPESTATUS[0]}
echo "bench exit status $bench_rc"
exit $(( fit_rc != 0 ? fit_rc : bench_rc ))
