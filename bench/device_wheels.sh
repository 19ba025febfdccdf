#!/usr/bin/env bash
# Download the wheels the GPU benches carry to the device machine (ignored by git; a device call takes
# them with carry [".whl"] or [".whl-scale"], bench/gpu_suite.sh installs them into /tmp/site).
# The device image (Python 3.12, torch 2.11, transformers 5.17) lacks these; versions are the ones
# this repository's tests run with (pyproject.toml's environment), so the GPU runs use the same code.
#   bash bench/device_wheels.sh          # .whl/: the one-GPU benches (TRL, retrieval server), ~37 MB
#   bash bench/device_wheels.sh --scale  # .whl-scale/: the many-GPU bench (bench/gpu_scale.py: Ray
#                                        # without its Java jar, DeepSpeed), carried instead of .whl/
# A call carries at most 64 MiB with the working tree (~5 MB), so the two sets travel in separate calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scale=0
[ "${1:-}" = "--scale" ] && scale=1
dest=.whl; [ $scale = 1 ] && dest=.whl-scale
mkdir -p "$dest"
# shellcheck source=bench/device_pip.sh
. bench/device_pip.sh
get() { device_download "$dest" "$@"; }
# both sets: transformers 5.19 with pydantic, and the gateway the trainer imports
get transformers==5.19.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0
get httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 tenacity==9.2.1
python=${VENV_PYTHON:-.venv/bin/python}   # the project venv (torch: DeepSpeed's build; the MiniLM tokenizer)
[ -x "$python" ] || { echo "error: $python not found: run \`make venv-test\` first, or set VENV_PYTHON" >&2; exit 1; }
if [ $scale = 1 ]; then
    # Ray 2.60 (79 MB as published) repacked without what a Python driver and its actors never load: the
    # Java jar (32 MB), the dashboard's web client and the libraries above core (RLlib, Tune, Train,
    # Serve, Data, LLM); its RECORD is rewritten to match
    get ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    python3 - "$dest"/ray-2.60.0-*.whl <<'PY'
import sys, zipfile, os
path = sys.argv[1]
drop = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/",
        "ray/data/", "ray/llm/")
if not any(i.filename.startswith(drop) for i in zipfile.ZipFile(path).infolist()):
    sys.exit(0)   # already repacked
tmp = path + ".tmp"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
    for info in src.infolist():
        if info.filename.startswith(drop):
            continue
        data = src.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l for l in data.splitlines(keepends=True) if not l.decode().startswith(drop))
        out.writestr(info, data)
os.replace(tmp, path)
print(f"repacked {os.path.basename(path)}: {os.path.getsize(path) / 1e6:.1f} MB")
PY
    # DeepSpeed publishes only its source; a pure-Python wheel (ops compiled just in time, none ahead)
    # built with the venv's torch, and what it needs beyond the image
    if ! ls "$dest"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
        DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" deepspeed==0.19.8
    fi
    get hjson==3.1.0
else
    # TRL's GRPOTrainer (bench/gpu_grpo_e2e.py)
    get trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    # the retrieval server (bench/retrieval_gpu.py's server and cpu sections)
    get fastapi==0.136.3 starlette==1.10.0 annotated-doc==0.0.7 uvicorn==0.55.0 httptools==0.9.0 anyio==4.16.0 \
        sniffio==1.3.1 click==8.5.1 faiss-cpu==1.15.1
    # the retrieval bench's tokenizer (the shipped MiniLM's BERT-uncased files; the model package itself is 88 MB)
    mkdir -p .whl/minilm-tokenizer
    minilm=$("$python" -c "from orchestrator.embedded import minilm_path; print(minilm_path())") \
        || { echo "error: the MiniLM tokenizer needs the project venv: run \`make venv-test\` first" >&2; exit 1; }
    for f in tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do cp "$minilm/$f" .whl/minilm-tokenizer/; done
fi
ls "$dest" | wc -l
total=$(du -sb "$dest" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "$dest: $((total / 1048576)) MiB; with the tracked working tree ($((tree / 1048576)) MiB): $(((total + tree) / 1048576)) MiB of the 64 MiB a call may carry"
[ $((total + tree)) -le $((64 * 1048576)) ] || { echo "error: over the 64 MiB a device call may carry" >&2; exit 1; }
