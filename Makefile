# loopnet: two commands from a fresh clone.
#   make fit   set up .venv and train DeepLoop K=2 x R=6 on the embedded corpus (CPU, ~6 min)
#   make test  set up .venv and run the test suite (offline)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CONFIG ?= configs/deeploop_r6.yaml
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: setup fit test tensorboard clean

setup: $(STAMP)

# torch is pinned and installed first: an unpinned torch pulled in by a dependency is a CUDA build of several GB.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

fit: $(STAMP)
	$(VENV)/bin/loopnet fit --config $(CONFIG) --config configs/cpu.yaml

test: $(STAMP)
	$(PY) -m pytest -q tests

tensorboard: $(STAMP)
	$(VENV)/bin/tensorboard --logdir runs --host 127.0.0.1 --port 6006

clean:
	rm -rf $(VENV) runs
