# Two entry points, each works on a fresh machine (Python 3.10+ with venv):
#   make demo  - install everything, train the sparse VAE on the built-in synthetic data
#   make test  - install everything, run the test suite
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: demo test install benchmarks clean

$(BIN)/pyro-sparse: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch==2.13.0 first: on this project's machines that is a local CPU wheel; any
	# other spec (or torch pulled in by pyro-ppl) downloads gigabytes of CUDA packages.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[plot,test]"
	touch $@

install: $(BIN)/pyro-sparse

demo: install
	$(BIN)/pyro-sparse train --model ssl_dgm --data synthetic --latent-dim 5 --out demo-output

test: install
	$(BIN)/pytest

clean:
	rm -rf $(VENV) demo-output .pytest_cache
