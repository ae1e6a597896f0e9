# Two commands do all the set-up on a fresh machine with Python 3.11:
#   make run    install into .venv (when missing or stale) and open the app on a sample model
#   make test   install into .venv (when missing or stale) and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?= sample_models/seed_explosion.py

.PHONY: install run test lint bench

install: $(STAMP)

# torch and torchvision first, pinned to the release on this machine's disk: a bare `torch`
# would pull the newest CUDA build (several GB) from the registry.
$(STAMP): pyproject.toml Makefile
	@echo "Installing GradScope and torch into $(VENV) (a minute or two, quietly)..."
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e ".[test,hf,timm,lightning]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gradscope $(MODEL)

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check gradscope tests benchmarks sample_models

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	QT_QPA_PLATFORM=offscreen $(BIN)/python benchmarks/gui.py
