# `make demo` and `make test` each create .venv if missing and install everything from this repo's files.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
LOWEST_VENV := .venv-lowest
PY := $(VENV)/bin/python
STAMP := $(VENV)/.convalue-installed
export RAY_USAGE_STATS_ENABLED ?= 0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test bench-check test-lowest lint bench clean browser

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev,all]'
	$(PY) -m pip install -q --no-deps -c $(CONSTRAINTS) -r requirements-nodeps.txt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/convalue run examples/demo.yaml --overwrite

# two pytest workers, each with its own local Ray, taking whole files (the pipeline tests share one session run)
# in collection order: the modules marked heavy first (tests/conftest.py), so the workers finish together
TEST_WORKERS ?= 2

test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not bench'

# the tests that run each bench script at a tiny size (studies and their harnesses stay out of `make test`)
bench-check: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m bench

# report.html's browser test needs chromium (and fonts for every script): installed where make runs as root with
# apt-get, best effort (offline or refused, the test skips itself and the target goes on)
browser:
	-@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium and Noto fonts for the browser test of report.html (apt-get)"; \
	    (timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq \
	      --no-install-recommends chromium fonts-noto-core fonts-noto-cjk) >/dev/null 2>&1 || \
	      echo "chromium could not be installed: the browser test of report.html will be skipped"; \
	  else echo "no chromium: the browser test of report.html will be skipped (apt-get install chromium)"; fi

# the same suite on every dependency's floor at once, in a virtualenv of its own (downloads torch 2.6's CUDA build)
test-lowest:
	$(MAKE) test VENV=$(LOWEST_VENV) CONSTRAINTS=constraints-lowest.txt

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) bench/solvers.py

clean:
	rm -rf $(VENV) $(LOWEST_VENV) runs .pytest_cache
