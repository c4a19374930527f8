# stp: two entry points on a fresh machine (Python 3.11 + pip):
#   make demo   - install into .venv and run the main job on the bundled examples
#   make test   - install into .venv and run the test suite (tests/test_docs.py builds the docs too)
#   make docs   - build the documentation site into site/ (mkdocs build --strict)
#   make docs-generate - regenerate the committed generated page docs/rule-language.md
# The package is installed NON-editable, so tests exercise the shipped rules/templates.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STP    := $(VENV)/bin/stp
OUT    ?= out/demo
PYTEST_ARGS ?=

.PHONY: install demo test docs docs-generate bench bench-time clean

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip uninstall -q -y steptp
	touch $@

install: $(VENV)/.deps
	$(PY) -m pip install -q --no-deps --no-build-isolation --force-reinstall .
	rm -rf build

demo: install
	$(STP) translate examples/matmul.py -o $(OUT)/matmul.leir --verify
	$(STP) apply rules/loop_split.yaml $(OUT)/matmul.leir --seed 0 -o $(OUT)/matmul_split.leir
	$(STP) verify $(OUT)/matmul.leir $(OUT)/matmul_split.leir
	$(STP) translate examples/softmax.py -o $(OUT)/softmax.leir --verify
	$(STP) apply rules/online_softmax.yaml $(OUT)/softmax.leir -o $(OUT)/softmax_online.leir
	$(STP) verify $(OUT)/softmax.leir $(OUT)/softmax_online.leir
	$(STP) dataset examples -o $(OUT) --seed 0 -j 2
	$(STP) report $(OUT) > /dev/null
	@echo "demo dataset written to $(OUT)/ (summary: $(OUT)/report.md)"

test: install
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-generate: install
	$(STP) rules docs -o docs/rule-language.md

bench: install
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/bench_costmodel.py

bench-time: install
	$(PY) benchmarks/bench_time.py

clean:
	rm -rf $(VENV) build out site *.egg-info engine/*.egg-info
