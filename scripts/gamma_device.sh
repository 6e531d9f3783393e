#!/usr/bin/env bash
# The depth exponent's decisive core (docs/results/gamma/PREREGISTRATION.md) on a lent machine's CPU cores.
# Here, once:  make device-wheels    (cp312 wheels of what the GPU image lacks, into .whl/; docs/gpu-check.md)
# There, in one call of the device tool:  bash scripts/gamma_device.sh   with carry [".whl"], timeout_s 600.
#
# The cells run as the existing data ran: CPU, fp32 (configs/cpu.yaml), one thread per fit, as many fits at once
# as the machine has cores (16 on the H200 machine); the GPU is not used (its kernels would change the arithmetic).
# Seeds run in two stages, 1-4 then 5-8, so a run cut short by the budget leaves whole seeds: every seed that
# finished has all its cells on one machine, and the readings pair the arms by seed. Unfinished cells are left
# unfinished (the sweep resumes them from scratch later, here or there).
#
# Budget: GAMMA_BUDGET_S (default 540 s) for the whole script; a stage starts only with 120 s or more left, and 45 s
# are kept for packing. Out ($OUT, at most 8 files come back): gamma_device.log (versions, timings, the sweep's
# output) and gamma_core_runs.tar.gz, the sweep folder without checkpoints or event files (the manifest, and each
# cell's summary.json, config.yaml, hparams.yaml and fit.log). Back here:
#   mkdir -p runs/sweeps && tar -xzf <files_at>/gamma_core_runs.tar.gz -C runs/sweeps
#   make gamma-core      (finishes any cell left, on this machine; then the report and the readings)
set -uo pipefail
OUT=${OUT:-/tmp/gamma_device}
BUDGET_S=${GAMMA_BUDGET_S:-540}
RUN=/tmp/gamma_core  # the sweep folder (checkpoints stay here; only the light files travel back)
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
exec > >(tee -a "$OUT/gamma_device.log") 2>&1

if compgen -G ".whl/*.whl" >/dev/null; then
    timeout 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl \
        || { echo "gamma_device: installing .whl/ failed; fix: make device-wheels"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
fi
python3 - <<"PY" || { echo "gamma_device: loopnet does not import here; fix: make device-wheels, carry .whl"; exit 1; }
import os, platform, sys, torch
import loopnet.training.cli  # noqa: F401  (fails here, not in 288 fits)
print("gamma_device: python", sys.version.split()[0], "| torch", torch.__version__, "|", platform.processor() or
      platform.machine(), "|", os.cpu_count(), "cores")
PY
grep -m1 "model name" /proc/cpuinfo
JOBS=$(nproc)

for seeds in "1 2 3 4" "5 6 7 8"; do
    budget=$(($(left) - 45))
    if [ "$budget" -lt 120 ]; then
        echo "gamma_device: ${budget}s left for seeds $seeds: not started (make gamma-core runs them later)"
        break
    fi
    only=()
    for s in $seeds; do only+=(--only "*-s$s"); done
    echo "gamma_device: seeds $seeds, $JOBS fits at a time, at most ${budget}s"
    t0=$(date +%s)
    timeout -s TERM -k 30 "$budget" python3 -m loopnet sweep configs/sweeps/gamma/core.yaml --out "$RUN" \
        --jobs "$JOBS" --threads 1 "${only[@]}"
    echo "gamma_device: seeds $seeds: exit $?, $(($(date +%s) - t0))s"
done

python3 - "$RUN" <<"PY"
import json, pathlib, sys, collections
run = pathlib.Path(sys.argv[1])
done, secs = collections.Counter(), collections.defaultdict(list)
for s in run.glob("*/summary.json"):
    d = json.loads(s.read_text())
    if d.get("status") in ("completed", "diverged"):
        cell = s.parent.name
        done[cell.rsplit("-s", 1)[1]] += 1
        secs["r24" if "-r24-" in cell else "r2"].append(d.get("wall_time_s") or 0)
print("gamma_device: finished cells per seed (36 a seed):", dict(sorted(done.items())))
for r, v in sorted(secs.items()):
    print(f"gamma_device: {r}: {len(v)} fits, mean wall {sum(v) / len(v):.1f}s a fit")
PY
tar -czf "$OUT/gamma_core_runs.tar.gz" -C "$(dirname "$RUN")" --exclude='*.ckpt' --exclude='events.out.tfevents.*' \
    --exclude='.locks' "$(basename "$RUN")"
ls -la "$OUT"
