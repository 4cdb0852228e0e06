# FabricPool: `make demo` runs the whole thing on this machine, `make test` runs the tests.
# Both create the virtual environment .venv on first use and refresh it when pyproject.toml
# changes (the stamp file records the last install).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fabricpool-installed

# Extra arguments for pytest, e.g. make test PYTEST_ARGS='-m "not slow" -x'
export PYTEST_ARGS

.PHONY: demo test venv

demo: $(STAMP)
	$(BIN)/python scripts/run_demo.py

test: $(STAMP)
	$(BIN)/python scripts/run_tests.py

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if ! $(BIN)/python -c '' 2>/dev/null; then \
	  echo "creating $(VENV) with $(PYTHON)"; \
	  $(PYTHON) -m venv --clear $(VENV) || { \
	    echo "'$(PYTHON) -m venv' failed: on Debian or Ubuntu, install python3-venv (apt-get install python3-venv), or run make PYTHON=/path/to/python3.11+"; \
	    exit 1; }; \
	fi
	PIP_DISABLE_PIP_VERSION_CHECK=1 $(BIN)/python -m pip install --progress-bar off -e '.[test,bench]'
	@touch $@
