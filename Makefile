# Set-up and entry points. `make run` and `make test` each do the whole set-up first.
#
# torch: a machine with an NVIDIA driver gets PyPI's CUDA build; any other machine gets
# torch==2.13.0, which on this project's CPU machines is a CPU build already on disk
# (elsewhere, point pip at a CPU index: make setup TORCH_SPEC=torch PIP_EXTRA="--index-url ...").
# torch-scatter compiles from source against the installed torch (several minutes on two
# cores, cached by pip afterwards); where it does not build, the project runs without it.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HAS_NVIDIA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_SPEC ?= $(if $(HAS_NVIDIA),torch,torch==2.13.0)
PIP_EXTRA ?=
WITH_TORCH_SCATTER ?= 1

.PHONY: setup run test test-all layering bench fit experiments gpu-wheels gpu-dry-run clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PIP_EXTRA) "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	@if [ "$(WITH_TORCH_SCATTER)" = "1" ]; then \
	  echo "building torch-scatter against the installed torch (several minutes the first time)"; \
	  $(BIN)/pip install --quiet --no-build-isolation torch-scatter \
	    || echo "torch-scatter did not build here: the torch_scatter backend is skipped, native torch aggregation is used"; \
	fi
	$(BIN)/python -c "import torch; print('torch', torch.__version__, 'cuda' if torch.cuda.is_available() else 'cpu')"
	touch $@

run: setup          ## the main job: MoE layer latency vs routing concentration
	$(BIN)/python -m sim experiment=moe_skew

test: setup         ## the default test suite (slow and gpu tests deselected)
	$(BIN)/python -m pytest

test-all: setup     ## every test, slow and gpu ones included where the machine allows
	$(BIN)/python -m pytest -m ""

layering:           ## import cycles and imports up experiments -> sim -> costmodel (ast only, nothing imported)
	$(PYTHON) scripts/check_layering.py

bench: setup        ## measure this device: python -m costmodel bench suite=full
	$(BIN)/python -m costmodel bench suite=full

fit: setup
	$(BIN)/python -m costmodel fit

experiments: setup  ## every experiment, one after the other (Hydra multirun)
	$(BIN)/python -m sim -m 'experiment=glob(*)'

# The lent GPU machine's image lacks these pure-Python packages and reaches no index: they travel
# as wheels in .whl/ (git-ignored; name `.whl` in the device call's carry). See scripts/gpu_check.sh.
GPU_WHEELS ?= hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3

gpu-wheels:         ## the wheels scripts/gpu_check.sh installs on the GPU machine (no index there)
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir .whl $(GPU_WHEELS)
	@ls .whl

gpu-dry-run: setup gpu-wheels  ## scripts/gpu_check.sh on the CPU, in a venv with only the GPU image's packages
	$(BIN)/python scripts/image_venv.py .venv-image
	rm -rf gpu_dry_out
	DRY_RUN=1 PY=$(CURDIR)/.venv-image/bin/python OUT=$(CURDIR)/gpu_dry_out scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .venv-image .whl gpu_out gpu_dry_out outputs multirun .pytest_cache
