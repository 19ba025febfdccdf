#!/usr/bin/env bash
# Download the wheels the GPU benches carry to the device machine into .whl/ (ignored by git; a
# device call takes it with carry [".whl"], bench/gpu_suite.sh installs it into /tmp/site).
# The device image (Python 3.12, torch 2.11, transformers 5.17) lacks these; versions are the ones
# this repository's tests run with (pyproject.toml's environment), so the GPU runs use the same code.
#   bash bench/device_wheels.sh          # ~45 MB, well under the 64 MiB a call may carry
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
get() {   # pure-Python or cp312 manylinux wheels, no dependencies (the list below is complete)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any -d .whl "$@" 2>&1 | grep -v "is ignored" || true
}
# TRL's GRPOTrainer (bench/gpu_grpo_e2e.py) and transformers 5.19 with pydantic
get trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 transformers==5.19.0 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
# the gateway the trainer imports
get httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 tenacity==9.2.1
# the retrieval server (bench/retrieval_gpu.py's server and cpu sections)
get fastapi==0.136.3 starlette==1.10.0 annotated-doc==0.0.7 uvicorn==0.55.0 httptools==0.9.0 anyio==4.16.0 \
    sniffio==1.3.1 click==8.5.1 faiss-cpu==1.15.1
# the retrieval bench's tokenizer (the shipped MiniLM's BERT-uncased files; the model package itself is 88 MB)
mkdir -p .whl/minilm-tokenizer
minilm=$(.venv/bin/python -c "from orchestrator.embedded import minilm_path; print(minilm_path())") \
    || { echo "error: the MiniLM tokenizer needs the project venv: run \`make venv-test\` first" >&2; exit 1; }
for f in tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do cp "$minilm/$f" .whl/minilm-tokenizer/; done
ls .whl | wc -l
du -sh .whl
