# tileops: every command a contributor needs. CPU targets create .venv on first use.
PYTHON_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The GPU machine brings its own python with torch (see README: "Working on a GPU").
GPU_PY ?= python3
OPS ?=
WORKLOADS ?=

.PHONY: setup gen gen-check validate test test-gpu bench bench-models bench-readme new-op clean

$(STAMP): pyproject.toml
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so the dev install does not pull CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

gen: $(STAMP)
	$(PY) -m codegen gen

gen-check: $(STAMP)
	$(PY) -m codegen check

validate: $(STAMP)
	$(PY) -m validator

# The CPU tests run in one worker process a core (pytest-xdist).
test: $(STAMP)
	$(PY) -m codegen check
	$(PY) -m benchmarks.readme --check
	$(PY) -m pytest -q -m "not gpu" -n auto tests

# The programs the GPU tests launch are compiled first, in parallel (TileLang caches them on disk).
# Where the GPU python has pytest-xdist, the tests spread over worker processes, which take the
# host's GPUs in turn; the few that allocate tens of GiB (big_memory) run after them, one at a time
# on each GPU.
GPU_TEST_WORKERS ?= 8
HAS_XDIST = $(shell $(GPU_PY) -c "import xdist" >/dev/null 2>&1 && echo yes)
GPU_COUNT = $(shell $(GPU_PY) -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
XDIST_ARGS = $(if $(HAS_XDIST),-p xdist -n $(GPU_TEST_WORKERS) --dist load)
BIG_MEMORY_ARGS = $(if $(and $(HAS_XDIST),$(filter-out 0 1,$(GPU_COUNT))),-p xdist -n $(GPU_COUNT) --dist load)

test-gpu:
	$(GPU_PY) -m tests.gpu.warmup
	$(GPU_PY) -m pytest -q -m "gpu and not big_memory" $(XDIST_ARGS) tests/gpu
	$(GPU_PY) -m pytest -q -m "gpu and big_memory" $(BIG_MEMORY_ARGS) tests/gpu

bench:
	$(GPU_PY) -m benchmarks $(if $(OPS),--ops $(OPS)) $(if $(WORKLOADS),--workloads $(WORKLOADS))

# The same harness over the sizes of published models (benchmarks/model_shapes.py).
bench-models:
	$(GPU_PY) -m benchmarks.model_shapes $(if $(OPS),--ops $(OPS)) $(if $(WORKLOADS),--workloads $(WORKLOADS))

# Re-render the README's results table from the committed CSVs after a bench run.
bench-readme: $(STAMP)
	$(PY) -m benchmarks.readme

new-op: $(STAMP)
	@test -n "$(NAME)" -a -n "$(FAMILY)" || { echo "usage: make new-op NAME=FooFwdOp FAMILY=bar"; exit 2; }
	$(PY) -m codegen new-op $(NAME) --family $(FAMILY)
	$(PY) -m codegen gen

clean:
	rm -rf $(VENV) .pytest_cache
