"""Where the flat index's per-chunk top-k time goes (GPU), per stage, per group size, in both score layouts.

    python bench/retrieval_topk_parts.py [--batch 256 --chunk 1048576 --keep 26 --groups 64,256,512]

retrieval/torch_flat.py's chunk_topk in stages: the group maxima, the top `keep` groups, the
gather of their scores, the final top-k. Two layouts of one chunk's fp16 scores: `queries x
passages` ([b, c] = q @ part.T: the group maxima reduce 64 contiguous columns per output, the
layout before 2026-12-04) and `passages x queries` ([c, b] = part @ q.T: the maxima reduce
across rows with the queries contiguous, today's). Beside them the plain torch.topk and the GEMM
(at --dim). CUDA events (wall time on a CPU), median of --reps; --json writes every number.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def timed(fn, reps: int) -> float:
    import torch

    fn()
    if not torch.cuda.is_available():           # a CPU smoke run: wall milliseconds
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e3
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def group_row(qp, pq, ref, keep: int, g: int, reps: int) -> dict:
    """The stages at group size g in both layouts (qp: [b, c] scores, pq: [c, b]; ref: plain top-k values)."""
    import torch

    from retrieval.torch_flat import chunk_topk
    (b, c), dev = qp.shape, qp.device
    groups = c // g
    row = {"group": g}
    # queries x passages: maxima over g contiguous columns per output
    view = qp[:, :groups * g].view(b, groups, g)
    row["qp_amax_ms"] = timed(lambda: view.amax(dim=2), reps)
    row["qp_topk_maxima_ms"] = timed(lambda: view.amax(dim=2).topk(keep, dim=1), reps) - row["qp_amax_ms"]
    best = view.amax(dim=2).topk(keep, dim=1).indices
    cols = (best.unsqueeze(2) * g + torch.arange(g, device=dev)).view(b, keep * g)
    row["qp_gather_ms"] = timed(lambda: qp.gather(1, cols), reps)
    # passages x queries: maxima across rows, queries contiguous
    grouped = pq[:groups * g].view(groups, g, b)
    row["pq_amax_ms"] = timed(lambda: grouped.amax(dim=1), reps)
    row["pq_topk_maxima_ms"] = timed(lambda: grouped.amax(dim=1).T.topk(keep, dim=1), reps) - row["pq_amax_ms"]
    index = grouped.amax(dim=1).T.topk(keep, dim=1).indices.unsqueeze(2).expand(b, keep, g)
    row["pq_gather_ms"] = timed(lambda: grouped.permute(2, 0, 1).gather(1, index), reps)
    row["chunk_topk_ms"] = timed(lambda: chunk_topk(pq, keep, g), reps)
    row["same_values"] = bool(torch.equal(chunk_topk(pq, keep, g)[0], ref))
    return row


def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--chunk", type=int, default=1 << 20)
    p.add_argument("--keep", type=int, default=26)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--groups", default="64,256,512")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, c, keep = args.batch, args.chunk, args.keep
    q = torch.randn(b, args.dim, device=dev, dtype=torch.float16)
    part = torch.randn(c, args.dim, device=dev, dtype=torch.float16)
    qp, pq = q @ part.T, part @ q.T                        # [b, c] and [c, b]
    ref = qp.topk(keep, dim=1).values
    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "batch": b, "chunk": c,
           "keep": keep, "gemm_qp_ms": timed(lambda: q @ part.T, args.reps),
           "gemm_pq_ms": timed(lambda: part @ q.T, args.reps),
           "plain_topk_ms": timed(lambda: qp.topk(keep, dim=1), args.reps), "groups": []}
    for g in map(int, args.groups.split(",")):
        row = group_row(qp, pq, ref, keep, g, args.reps)
        res["groups"].append(row)
        print(row, flush=True)
    print(json.dumps({k: v for k, v in res.items() if k != "groups"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
