# Two entry points for users: `make demo` and `make test`. Both create .venv themselves.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SRC ?=
FORMAT ?= auto
# pytest-xdist worker processes for `make test` (the suite's own DDP, pools and servers fit two on a 2-core box)
WORKERS ?= 2

.PHONY: demo test lint bench docs clean browser

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (or: make PY=python3 ...)"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the pin picks a version, not a build; the CPU build comes only from a configured CPU wheel or index (README: Which PyTorch build you get).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py $(if $(SRC),--src $(SRC) --format $(FORMAT),)

test: $(STAMP)
	bash .ci/slurm.sh  # slurm-wlm + munge for the real Slurm test (apt-get as root, when missing)
	$(BIN)/ruff check episodepipes scripts tests benchmarks docs
	$(BIN)/lint-imports  # the layers of DESIGN.md "Layout" (pyproject [tool.importlinter])
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile  # whole files per worker (tests/conftest.py)

lint: $(STAMP)
	$(BIN)/ruff check episodepipes scripts tests benchmarks docs

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

browser:  # Debian's chromium + chromium-driver for the show page's browser test (as root; tests/browser.py does the same)
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver

docs: $(STAMP)  # regenerate docs/API.md from the docstrings (tests/project/test_docs.py checks it is current)
	$(BIN)/python scripts/gen_api_docs.py

clean:
	rm -rf $(VENV) demo_out .pytest_cache
