"""What of two quickstart runs of one seed is bit-identical (e.g. the AVX-512 kernels against the
AVX2 kernels forced on the same CPU with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2), stage by stage.

    python bench/quickstart_kernel_paths.py RUN_A RUN_B

Per stage: the world's files (bytes), the MiniLM/FAISS indexes (bytes; the embeddings are float
kernel output), the initial random policy and the warmed-up policy (every weight, bit for bit, and
the largest difference), the held-out trajectories before and after training (the tool calls of
every episode, whether each is right, its cost), and the trained policy's weights.  Prints one line
per item; exit status 0.  Reads only the run folders.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def files(a: Path, b: Path, sub: str) -> str:
    names = sorted(p.relative_to(a / sub) for p in (a / sub).rglob("*") if p.is_file())
    differ = [str(n) for n in names if not (b / sub / n).is_file() or _digest(a / sub / n) != _digest(b / sub / n)]
    return f"{sub}: {len(names) - len(differ)} of {len(names)} files identical" + (f" (differ: {differ})" if differ else "")


def weights(a: Path, b: Path) -> str:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    same = [k for k in wa if k in wb and wa[k].shape == wb[k].shape and bool((wa[k] == wb[k]).all())]
    diff = max(((wa[k].float() - wb[k].float()).abs().max().item() for k in wa if k in wb and k not in same),
               default=0.0)
    return f"{len(same)} of {len(wa)} tensors bit-identical, largest difference {diff:.3g}"


def trajectories(a: Path, b: Path) -> str:
    def rows(p: Path):
        return [json.loads(line) for line in p.read_text().splitlines()]

    out = []
    for path in sorted(a.glob("eval_*.jsonl")):
        other = b / path.name
        if not other.is_file():
            continue
        ra, rb = rows(path), rows(other)
        calls = sum(x["tool_calls"] == y["tool_calls"] for x, y in zip(ra, rb))
        right = sum(x["correct"] == y["correct"] for x, y in zip(ra, rb))
        cost = sum(x["cost"] == y["cost"] for x, y in zip(ra, rb))
        out.append(f"{path.stem}: same calls {calls}/{len(ra)}, same verdict {right}/{len(ra)}, same cost {cost}/{len(ra)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    args = parser.parse_args(argv)
    a, b = args.run_a, args.run_b
    for sub in ("world",):
        if (a / sub).is_dir() and (b / sub).is_dir():
            print(files(a, b, sub))
    for policy in ("policy-init", "policy-warm"):
        if (a / policy / "model.safetensors").is_file() and (b / policy / "model.safetensors").is_file():
            print(f"{policy}: {weights(a / policy, b / policy)}")
    final = [sorted((s / "train" / "checkpoints").glob("step-*")) for s in (a, b)]
    if all(final) and final[0][-1].name == final[1][-1].name:
        print(f"trained policy ({final[0][-1].name}): {weights(final[0][-1] / 'model', final[1][-1] / 'model')}")
    print(trajectories(a, b))
    for s in (a, b):
        summary = s / "summary.json"
        if summary.is_file():
            data = json.loads(summary.read_text())
            print(f"{s}: {data['machine']['cpu_capability']}, kernel_env {data['machine'].get('kernel_env')}, "
                  f"checks {data.get('checks_holding')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
