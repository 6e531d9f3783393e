# loopnet: two commands from a fresh clone.
#   make fit   set up .venv (what training needs) and train DeepLoop K=2 x R=6 on the embedded corpus (CPU,
#              a few minutes); make fit ARGS="--ckpt_path last" resumes it, ARGS="..." passes any option
#   make test  set up .venv with the test extra too and run the test suite (offline)
#   make test-quick  the tests not marked slow (no real fits in subprocesses), a few minutes
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CONFIG ?= configs/deeploop_r6.yaml
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: setup fit test test-quick tensorboard clean device-wheels study map map-controls map-smoke rival rival-smoke width gamma-core gamma transfer mutants

setup: $(TEST_STAMP)

# torch is pinned and installed first: an unpinned torch pulled in by a dependency is a CUDA build of several GB.
# $(STAMP): what `loopnet` needs to train; $(TEST_STAMP): that and the test extra (pytest, lm-eval and its stack)
# in one install where $(STAMP) is not made yet (it makes $(STAMP) too: a fresh `make test` resolves once).
# pip installs with --no-compile, and COMPILE writes the bytecode afterwards on every core (pip compiles one
# file at a time: ~60 s against ~32 s on 2 cores). As pip does, it skips what is not Python 3.11 (torch's
# py312 test helpers), hence its status is not read.
BASE = $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --upgrade pip && $(PY) -m pip install --no-compile torch==2.13.0
COMPILE = $(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
$(STAMP): pyproject.toml
	$(BASE)
	$(PY) -m pip install --no-compile -e .
	$(COMPILE)
	touch $(STAMP)

$(TEST_STAMP): pyproject.toml
	test -f $(STAMP) || { $(BASE); }
	$(PY) -m pip install --no-compile -e '.[test]'
	$(COMPILE)
	touch $(STAMP) $(TEST_STAMP)

# ARGS: more options for the fit. LOOPNET_RESUME is the command a stopped fit prints to resume it: this one,
# with --ckpt_path last. The PATH hint is printed whatever the fit's outcome (and the fit's exit status kept).
ARGS ?=
RESUME_ARGS = $(strip $(subst --ckpt_path last,,$(ARGS)) --ckpt_path last)
fit: $(STAMP)
	@LOOPNET_RESUME='make fit$(if $(filter command line,$(origin CONFIG)), CONFIG=$(CONFIG)) ARGS="$(RESUME_ARGS)"' \
	 $(VENV)/bin/loopnet fit --config $(CONFIG) --config configs/cpu.yaml $(ARGS); status=$$?; \
	 echo "loopnet is in $(VENV)/bin, not on your PATH: run '. $(abspath $(VENV))/bin/activate' (or 'export PATH=$(abspath $(VENV))/bin:\$$PATH') to type 'loopnet ...'"; \
	 exit $$status

# The lint and the format check first (seconds), then the suite on two pytest-xdist workers, a test module per
# worker (its module-scoped fits are made once), each with one intra-op thread so that the two do not compete
# for the two cores; the modules in the order tests/conftest.py gives (the slow ones first).
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
test: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PYTEST) tests

test-quick: $(TEST_STAMP)
	$(PYTEST) -m "not slow" tests

# The CPU study that orders the schemes (docs/results/order/README.md): four sweeps, the
# update-size probe and their reports, ~1-2 h on 2 cores. Rerunning skips the finished cells.
ORDER := docs/results/order
STUDY_CONFIG := --config configs/deeploop_r6.yaml --config configs/cpu.yaml --config configs/study_cpu.yaml
study: $(STAMP)
	for s in lr schemes exponent flt; do $(VENV)/bin/loopnet sweep configs/sweeps/order/$$s.yaml --jobs 2 || exit 1; done
	OMP_NUM_THREADS=2 $(VENV)/bin/loopnet probe $(STUDY_CONFIG) --model.optim.lr 1e-3 --rounds 1 2 4 8 16 32 \
	    --schemes postln deepnorm deeploop p0.375 --seeds 1 2 3 --steps 3 --out $(ORDER)/update_size \
	    --title "Update size vs R at initialisation" --notes $(ORDER)/update_size/notes.md
	$(VENV)/bin/loopnet report runs/sweeps/order_lr --out $(ORDER)/lr --title "Order study 1/4: learning rate per scheme" --notes $(ORDER)/lr/notes.md
	$(VENV)/bin/loopnet report runs/sweeps/order_schemes --out $(ORDER)/schemes --title "Order study 2/4: schemes x R" --notes $(ORDER)/schemes/notes.md
	$(VENV)/bin/loopnet report runs/sweeps/order_exponent --out $(ORDER)/exponent --title "Order study 3/4: exponent sweep" --notes $(ORDER)/exponent/notes.md
	$(VENV)/bin/loopnet report runs/sweeps/order_flt --out $(ORDER)/flt --title "Order study 4/4: LT vs FLT at 12 loops" --notes $(ORDER)/flt/notes.md

# The stability map (docs/results/map/README.md): the grid (DeepNorm, DeepLoop x R x lr x 2 seeds),
# the boundary refinement, the exponent sweep and the confirmation on fresh seeds (their cells chosen from the
# grid by experiments.followup), the per-group update probe (at init over R, and at steps 0/100/200 of four
# runs), and the reports.
# ~2 h on an idle 2-core machine (docs/studies.md). Rerunning skips the finished cells.
MAP := docs/results/map
MAP_CONFIG := --config configs/deeploop_r6.yaml --config configs/cpu.yaml --config configs/study_map.yaml
LN := $(VENV)/bin/loopnet
map: $(STAMP)
	$(LN) sweep configs/sweeps/map/grid.yaml --jobs 2 --only 'deep*'
	$(PY) -m experiments.followup boundary runs/sweeps/map_grid --out configs/sweeps/map/boundary.yaml
	$(LN) sweep configs/sweeps/map/boundary.yaml --jobs 2
	$(PY) -m experiments.followup exponent runs/sweeps/map_grid runs/sweeps/map_boundary --out configs/sweeps/map/exponent.yaml
	$(LN) sweep configs/sweeps/map/exponent.yaml --jobs 2
	$(PY) -m experiments.followup confirm runs/sweeps/map_grid --out configs/sweeps/map/confirm.yaml
	$(LN) sweep configs/sweeps/map/confirm.yaml --jobs 2
	$(LN) sweep configs/sweeps/map/probe_runs.yaml --jobs 2
	OMP_NUM_THREADS=2 $(LN) probe $(MAP_CONFIG) --groups --rounds 2 6 12 --schemes deepnorm deeploop --seeds 1 2 3 --out $(MAP)/probe_init
	OMP_NUM_THREADS=2 $(LN) probe $(MAP_CONFIG) --model.config.norm_affine false --groups --rounds 2 6 12 --schemes deepnorm deeploop --seeds 1 2 3 --out $(MAP)/probe_init_nogain
	OMP_NUM_THREADS=2 $(LN) probe $(MAP_CONFIG) --model.optim.lr 2e-3 --groups --checkpoints runs/sweeps/map_probe_runs/*/checkpoints/step*.ckpt --with_init --seeds 1 --out $(MAP)/probe_training
	$(LN) report runs/sweeps/map_grid --out $(MAP)/grid --title "Stability map 1/4: loss vs learning rate, DeepNorm and DeepLoop x R"
	$(LN) report runs/sweeps/map_boundary --out $(MAP)/boundary --title "Stability map 2/4: the boundary at the smallest and the largest R"
	$(LN) report runs/sweeps/map_exponent --out $(MAP)/exponent --title "Stability map 3/4: training vs the exponent p"
	$(LN) report runs/sweeps/map_confirm --out $(MAP)/confirm --title "Stability map 4/4: reading 2 on fresh seeds at each best rate"

# The map's controls: Post-LN and Pre-LN on the grid (84 fits) and below it at R = 6 and 12 (16 fits), ~35 min
# on a quiet 2-core machine (docs/studies.md), and their reports.
map-controls: $(STAMP)
	$(LN) sweep configs/sweeps/map/grid.yaml --jobs 2 --only 'postln*' --only 'preln*'
	$(LN) sweep configs/sweeps/map/controls.yaml --jobs 2
	$(LN) report runs/sweeps/map_grid --out $(MAP)/controls_grid --only 'postln*' --only 'preln*' --title "Stability map: the Post-LN and Pre-LN controls on the grid"
	$(LN) report runs/sweeps/map_controls --out $(MAP)/controls --title "Stability map: Post-LN and Pre-LN below the grid at R = 6 and 12"

# The map's pipeline end to end on 20-step fits (a few minutes): sweep -> report -> map tables and plots ->
# follow-up sweep files, all under runs/sweeps/map_smoke (not results).
map-smoke: $(STAMP)
	$(LN) sweep configs/sweeps/map/smoke.yaml --jobs 2
	$(LN) report runs/sweeps/map_smoke --title "Map smoke (20 steps: not results)"
	$(PY) -m experiments.followup boundary runs/sweeps/map_smoke --out runs/sweeps/map_smoke/boundary.yaml
	$(PY) -m experiments.followup exponent runs/sweeps/map_smoke --out runs/sweeps/map_smoke/exponent.yaml

# The rival rule and the width study (docs/results/rival/README.md), each resumable (finished cells are skipped).
# rival: Pre-LN x branch_scale (one, sqrt_depth, wang) x R x lr x 3 seeds (243 fits), then each arm's best rate on
# fresh seeds (27 fits + 1 DeepLoop, chosen by experiments.followup), and the reports: ~1.5 h (docs/studies.md).
# width: at d = 64 and 256, a one-seed pilot (28 fits), the boundary runs chosen from it (~60 fits, into a folder
# of their own), a report of each, then the readings: ~1 h measured (docs/studies.md), most of it d = 256. A stage
# whose report (or boundary sweep file) is committed is skipped, so the study can be run a stage at a time.
RIVAL := docs/results/rival
rival: $(STAMP)
	$(LN) sweep configs/sweeps/rival/grid.yaml --jobs 2
	$(PY) -m experiments.followup rival-confirm runs/sweeps/rival_grid --out configs/sweeps/rival/confirm.yaml
	$(LN) sweep configs/sweeps/rival/confirm.yaml --jobs 2
	$(LN) report runs/sweeps/rival_grid --out $(RIVAL)/grid --title "Rival rule 1/2: Pre-LN's branch multiplier x R x lr"
	$(LN) report runs/sweeps/rival_confirm --out $(RIVAL)/confirm --title "Rival rule 2/2: each arm's best rate on fresh seeds"
	$(PY) -m experiments.rival.readings --grid $(RIVAL)/grid --confirm $(RIVAL)/confirm --map $(MAP) --out $(RIVAL)/readings.md

width: $(STAMP)
	for d in 64 256; do \
	  { test -f $(RIVAL)/width_d$$d/pilot/cells.csv || \
	    { $(LN) sweep configs/sweeps/width/d$${d}_pilot.yaml --jobs 2 && \
	      $(LN) report runs/sweeps/width_d$$d --out $(RIVAL)/width_d$$d/pilot --title "Width d = $$d, the pilot: DeepNorm and DeepLoop at R = 2 and 12, one seed"; }; } && \
	  { test -f configs/sweeps/width/d$${d}_boundary.yaml || \
	    $(PY) -m experiments.followup width runs/sweeps/width_d$$d --out configs/sweeps/width/d$${d}_boundary.yaml; } && \
	  { test -f $(RIVAL)/width_d$$d/boundary/cells.csv || \
	    { $(LN) sweep configs/sweeps/width/d$${d}_boundary.yaml --jobs 2 && \
	      $(LN) report runs/sweeps/width_d$${d}_boundary --out $(RIVAL)/width_d$$d/boundary --title "Width d = $$d, the boundary: six rates at x sqrt(2) around the pilot's, 3 seeds"; }; } \
	  || exit 1; done
	$(PY) -m experiments.width.readings 64=$(RIVAL)/width_d64/pilot,$(RIVAL)/width_d64/boundary \
	  128=$(MAP)/grid,$(MAP)/boundary 256=$(RIVAL)/width_d256/pilot,$(RIVAL)/width_d256/boundary --out docs/results/width/readings.md

# The depth exponent gamma (docs/results/gamma/PREREGISTRATION.md), resumable (finished cells are skipped).
# gamma-core: the decisive core first (1/sqrt(depth) and Wang x R in {2, 24} x 9 rates x 8 seeds, 288 fits), its
# report and the readings. gamma: the rest of the 8-seed ladder (768 fits), the high-rate tail (360), the
# 1,000-step check (120 fits, its sweep file written from the ladder by the pre-registered rule) and the readings
# into ladder_readings.md (readings.md stays the core's, as pre-registered).
GAMMA := docs/results/gamma
GAMMA_READ = $(PY) -m experiments.gamma.readings readings --rival $(RIVAL)/grid --out $(GAMMA)/readings.md
gamma-core: $(STAMP)
	$(LN) sweep configs/sweeps/gamma/core.yaml --jobs 2 --threads 1
	$(LN) report runs/sweeps/gamma_core --out $(GAMMA)/core --title "Depth exponent: the decisive core"
	$(GAMMA_READ) --cells $(GAMMA)/core

gamma: gamma-core
	$(LN) sweep configs/sweeps/gamma/ladder.yaml --jobs 2 --threads 1
	$(LN) sweep configs/sweeps/gamma/tail.yaml --jobs 2 --threads 1
	$(LN) report runs/sweeps/gamma_ladder --out $(GAMMA)/ladder --title "Depth exponent: the 8-seed ladder"
	$(LN) report runs/sweeps/gamma_tail --out $(GAMMA)/tail --title "Depth exponent: the high-rate tail"
	test -f configs/sweeps/gamma/long.yaml || $(PY) -m experiments.gamma.readings long-sweep \
	  --cells $(GAMMA)/core $(GAMMA)/ladder --out configs/sweeps/gamma/long.yaml
	$(LN) sweep configs/sweeps/gamma/long.yaml --jobs 2 --threads 1
	$(LN) report runs/sweeps/gamma_long --out $(GAMMA)/long --title "Depth exponent: the 1,000-step check"
	$(PY) -m experiments.gamma.readings readings --cells $(GAMMA)/core runs/sweeps/gamma_ladder runs/sweeps/gamma_tail \
	  --long runs/sweeps/gamma_long --rival $(RIVAL)/grid --out $(GAMMA)/ladder_readings.md

# The transfer reading (docs/results/transfer/PREREGISTRATION.md), resumable: the source, width and target cells
# (912 fits, in that order: the width reading needs only the first two), then the readings from the run folders.
TRANSFER := docs/results/transfer
transfer: $(STAMP)
	$(LN) sweep configs/sweeps/transfer/source.yaml --jobs 2 --threads 1
	$(LN) sweep configs/sweeps/transfer/width.yaml --jobs 2 --threads 1
	$(LN) sweep configs/sweeps/transfer/target.yaml --jobs 2 --threads 1
	$(PY) -m experiments.transfer.readings --cells runs/sweeps/transfer_source runs/sweeps/transfer_width \
	  runs/sweeps/transfer_target --out $(TRANSFER)

# The rival pipeline end to end on 20-step fits (a few minutes): sweep -> report -> the confirmation's sweep file,
# all under runs/sweeps/rival_smoke (not results).
rival-smoke: $(STAMP)
	$(LN) sweep configs/sweeps/rival/smoke.yaml --jobs 2
	$(LN) report runs/sweeps/rival_smoke --title "Rival smoke (20 steps: not results)"
	$(PY) -m experiments.followup rival-confirm runs/sweeps/rival_smoke --out runs/sweeps/rival_smoke/confirm.yaml

# Mutation testing (docs/testing.md; not part of CI): mutmut changes the code one small bug at a time where a
# silent bug corrupts the science, and runs on each mutant the quick tests that reach the changed function.
# The groups (functions mutated, tests that guard them) live in scripts/mutants.py; each runs in a scratch copy
# of the tree under MUTANTS_DIR (this checkout is never touched). `make mutants GROUPS="schedule probe"`: some.
MUTANTS_DIR ?= /tmp/loopnet-mutants
MUTANT_JOBS ?= 2
GROUPS ?=
mutants: $(TEST_STAMP)
	$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install -e '.[test,mutants]'
	MUTANTS_DIR=$(MUTANTS_DIR) MUTANT_JOBS=$(MUTANT_JOBS) $(PY) scripts/mutants.py $(GROUPS)


# make tensorboard PORT=6007: another port (one is in use, or two boards at once)
PORT ?= 6006
tensorboard: $(STAMP)
	$(VENV)/bin/tensorboard --logdir runs --host 127.0.0.1 --port $(PORT)

# For the GPU check on a GPU machine (docs/gpu-check.md): cp312 wheels of what its image lacks against the
# image's recorded versions (scripts/gpu_image.json; never torch), at the versions installed here, into .whl/
# (ignored); then the wheels and the working tree that travels with them are measured against the 64 MiB carry.
device-wheels: $(STAMP)
	rm -rf .whl && mkdir .whl
	@pins="$$($(PY) scripts/device_wheels.py pins)" || exit 1; \
	 echo "pip download (cp312):" $$pins; \
	 $(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $$($(PY) scripts/device_wheels.py platforms) -d .whl $$pins
	@ls .whl | sed 's/^/  /'; $(PY) scripts/device_wheels.py size .whl

clean:
	rm -rf $(VENV) runs
