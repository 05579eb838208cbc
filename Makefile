# The two commands: `make demo` and `make test`. Each creates .venv and installs the project if needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint bench outputs clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "dpopt needs Python >= 3.11, found " + sys.version' 
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,notebooks]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dpopt compare --workload allrange:256 --epsilon 1.0 --delta 1e-6 \
	    --mechanisms laplace,identity,hierarchical,wavelet,eigen,mm-optimal,om,hdmm
	$(BIN)/dpopt answer --epsilon 1.0 --delta 1e-6 --workload marginals:1 --mechanism mm-optimal --out -

# The tests run one BLAS thread each (tests/conftest.py), so one worker per core: JOBS=1 runs them serially.
JOBS ?= auto

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -p no:cacheprovider -n $(JOBS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check dpopt formulations tests benchmarks

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

# Regenerate every committed table and executed notebook at its committed size (hours; see --list).
outputs: $(STAMP)
	$(BIN)/python -m benchmarks.committed

clean:
	rm -rf $(VENV) build *.egg-info
