# Bursar developer entry points. `make demo` and `make test` work from a fresh clone.
#
#   make demo       run the flagship demo into out/demo, then the agent-burst scenario into out/sim
#                   (it ends with the claims table and where report.html is); installs the
#                   package with the plots extra only
#   make test       lint (ruff check) and run the test suite (installs the dev and plots
#                   extras, and the Debian packages some tests need when run as root:
#                   scripts/system-deps.sh)
#   make test-fast  the fast lane between edits: ruff check and the tests not marked slow
#                   (no subprocess broker, browser, Slurm, PostgreSQL, Ray, Parsl or Dask
#                   cluster; at most 3 minutes; tests/conftest.py says which modules are slow)
#   make lint       ruff check and ruff format --check
#   make matrix     replay every policy on the CTC-SP2, SDSC-SP2 and HPC2N traces into
#                   docs/replay-matrix.{md,html,json,png} (TRACES=dir overrides the traces)
#   make easy-check the reservation check: EASY, bursar-arrival and bursar on the same traces
#                   under examples/replay-easy-check.toml into docs/easy-check/
#   make whatif     replay CTC-SP2 under docs/whatif/baseline.toml and the candidates there
#                   into docs/whatif/whatif.{md,html,json,png} (TRACES=dir overrides the traces)
#   make docs       build the documentation site (mkdocs.yml, docs/) into out/site, strict:
#                   a broken link or a page left out of the nav fails (installs the docs extra)
#   make accel      build the optional mypyc-compiled replay and elastic allocator modules
#                   (broker/accel.py; needs a C compiler and Python headers; without them
#                   everything runs as pure Python)
#   make accel-clean  remove that build
#   make format     apply ruff's fixes and formatting
#   make clean      remove generated output and caches (keeps .venv)
#   make distclean  clean, and remove .venv too

# python3.11 where it exists, else the python3 on PATH (which must then be 3.11 or newer).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# A file target stands for "dependencies installed": it is older than pyproject.toml
# after an edit there, so the next make reinstalls before running anything. The demo needs
# only the base install and the plots extra; the tests need everything (dev), so `make demo`
# on a fresh clone installs no Dask, Parsl, Ray or test tools.
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
TEST_EXTRAS := dev,plots

.DEFAULT_GOAL := test
.PHONY: demo test test-fast lint format clean distclean system-deps matrix easy-check whatif accel accel-clean docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The distribution was called "bursar" before (that name on the public index is another
# project): a venv made then holds an editable "bursar" that would shadow this one.
define install
	$(BIN)/python -m pip uninstall -q -y bursar 2>/dev/null || true
	$(BIN)/python -m pip install -e '.[$(1)]'
endef

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(call install,plots)
	touch $@

# The test install is a superset of the demo's, so it stands for both.
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(call install,$(TEST_EXTRAS))
	touch $@ $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/bursar demo --out out/demo
	$(BIN)/bursar sim run --out out/sim

ACCEL_STAMP := $(VENV)/.installed-accel
$(ACCEL_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[accel]'
	touch $@

accel: $(ACCEL_STAMP)
	$(BIN)/python -m bursar.broker.accel build
	$(BIN)/python -m bursar.broker.accel status

accel-clean: | $(BIN)/python
	$(BIN)/python -m bursar.broker.accel clean

# Debian packages some tests need (Chromium, Slurm, munge); see scripts/system-deps.sh.
system-deps:
	scripts/system-deps.sh

# The in-process tests run on TEST_WORKERS pytest-xdist workers; the `serial` ones (they
# start servers, clusters or a browser that share the machine) then run one at a time.
# Both parts always run; the target fails if either did.
TEST_WORKERS ?= 2

test: $(TEST_STAMP) system-deps
	$(BIN)/ruff check .
	status=0; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not serial" || status=$$?; \
	$(BIN)/python -m pytest -q -m serial || status=$$?; \
	exit $$status

test-fast: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

# The traces live beside the repository (../shared/traces), never inside it.
TRACES ?= ../shared/traces

matrix: $(DEMO_STAMP)
	BURSAR_TRACES_DIR=$(TRACES) $(BIN)/bursar matrix --out docs

easy-check: $(DEMO_STAMP)
	BURSAR_TRACES_DIR=$(TRACES) $(BIN)/bursar matrix --policy easy --policy bursar-arrival \
	    --policy bursar --config examples/replay-easy-check.toml --out docs/easy-check

whatif: $(DEMO_STAMP)
	$(BIN)/bursar whatif --trace $(TRACES)/pwa-ctc-sp2/CTC-SP2-1996-3.1-cln.swf.gz \
	    --config docs/whatif/baseline.toml --candidate docs/whatif/tight-burst.toml \
	    --candidate docs/whatif/small-jobs-guarantee.toml --candidate capacity=400 \
	    --out docs/whatif

# The documentation site: the reference pages are generated from the source at build time
# (docs/gen_ref.py, a MkDocs hook), so the build imports the package.
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(call install,docs)
	touch $@

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir out/site

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(TEST_STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf out build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
