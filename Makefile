# flatcheck — set-up, demo, tests, benchmarks. `make demo` and `make test` work on a fresh machine.
# Torch is pinned here for this machine (the wheels lie on its disk); pyproject.toml keeps ranges.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install demo test test-all bench docs clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/flatcheck probe demo/digits_cnn.safetensors --spec model_specs/demo_digits.yaml --data digits \
		--probes trace,lmax,head-trace,relative-flatness,jacobian,activations,gini,gap \
		-o trace.estimator=hutchpp -o trace.probes_max=99 -o lmax.k=3 -o lmax.tol=1e-5
	$(VENV)/bin/flatcheck trace demo/digits_cnn.safetensors --spec model_specs/demo_digits.yaml \
		--data digits --estimator exact

# Tests run on every core (pytest-xdist), one thread each. `make test` is the fast tier: every
# probe and estimator against dense float64 truth and the commands end to end in this process,
# with line coverage of src/ held at 85 %; `make test-all` adds the checks over many seeds, the
# real-size runs (torchrun, ResNet-18, a GPU where there is one), those that start processes and
# the modules of whole workflows (gate runs, scans, reports, each marked `workflow` in its own file).
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist worksteal

test: install
	$(PYTEST) -m "not (statistical or realsize or process or workflow)" --cov --cov-report=term --cov-fail-under=85

test-all: install
	$(PYTEST)

# the bench extra (PyHessian, curvlinops, hessian-eigenthings); the torch pin is passed again so
# pip keeps the torch it has
BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(TORCH_PIN) -e '.[test,bench]'
	touch $(BENCH_STAMP)

# the docs extra (mkdocs-material, mkdocstrings); the site goes to site/ (mkdocs.yml)
DOCS_STAMP := $(VENV)/.docs-stamp
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(TORCH_PIN) -e '.[test,docs]'
	touch $(DOCS_STAMP)

docs: install $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: install $(BENCH_STAMP)
	$(PY) benchmarks/bench_trace.py
	$(PY) benchmarks/bench_head_trace.py
	$(PY) benchmarks/bench_peers.py --save
	$(PY) benchmarks/bench_lmax_cli.py --save

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache
