"""Exact inner-product top-k in torch: the flat index on GPUs without faiss-gpu.

The passage vectors (float16, as the shards hold them) are split into contiguous row ranges,
one per device. A search multiplies the batch of queries with each range in chunks (the
[chunk, batch] score block is bounded by `max_scores`), keeps the best `k + max(k, 16)`
candidates per chunk (`chunk_topk`: in two stages, through the maxima of groups of `group`
columns, so that the full-size top-k never runs; exact, see its docstring), and re-scores
the survivors in float32 from the same float16 vectors:
the scores are then those of a float32 flat index over the shards (faiss IndexFlatIP built by
retrieval.dense), up to summation order. A true top-k row is missed only if float16 rounding of
the candidate scores (|error| ~1e-4 for unit vectors) pushes it below k + max(k, 16) others,
which tests/retrieval/test_torch_flat.py checks against faiss and the GPU bench measures
(recall@10 against an exact float32 search on a sample).

Memory: 2 x dim bytes per passage on the devices (21M x 768: 32 GB), nothing extra on the host
after loading; loading streams the memory-mapped shards one at a time.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_SCORES = 1 << 28            # entries of one [chunk, batch] float16 score block (512 MiB)
GROUP = 64                      # columns per group in chunk_topk's first stage (0: plain top-k)


def candidates(k: int) -> int:
    """How many float16-ranked candidates are re-scored in float32 for a top-k."""
    return k + max(k, 16)


class TorchFlatIndex:
    """`search(queries [b, dim] f32, k) -> (scores [b, k] f32, rows [b, k] int64)`, best first.

    `shards`: float16 [m_i, dim] arrays in row order (e.g. `ShardVectors.shards`), `n` rows in all.
    `devices`: torch devices to spread the rows over (default: every visible GPU, else the CPU).
    """

    def __init__(self, shards: Sequence[np.ndarray], n: int, devices: Sequence[str] | None = None,
                 max_scores: int = MAX_SCORES, progress: bool = False, group: int = GROUP):
        import torch  # lazy: heavy (torch)
        from tqdm import tqdm  # lazy: display only

        if n < 1 or not shards:
            raise ValueError("TorchFlatIndex needs at least one vector")
        if devices is None:
            count = torch.cuda.device_count()
            devices = [f"cuda:{i}" for i in range(count)] if count else ["cpu"]
        self.devices = [torch.device(d) for d in devices]
        self.n, self.dim, self.max_scores, self.group = n, int(shards[0].shape[1]), max_scores, group
        per = math.ceil(n / len(self.devices))
        self.starts = [min(n, j * per) for j in range(len(self.devices))]
        self.parts = [torch.empty((min(n, s + per) - s, self.dim), dtype=torch.float16, device=d)
                      for s, d in zip(self.starts, self.devices)]
        row = 0
        with tqdm(total=n, unit="vec", desc="vectors to " + ",".join(map(str, self.devices)),
                  disable=not progress) as bar:
            for shard in shards:
                block = torch.from_numpy(np.array(shard, dtype=np.float16))     # a writable copy of one shard
                done = 0
                while done < len(block):             # a shard may straddle two devices' ranges
                    j = min(row // per, len(self.parts) - 1)
                    take = min(len(block) - done, self.starts[j] + len(self.parts[j]) - row)
                    self.parts[j][row - self.starts[j]:row - self.starts[j] + take].copy_(block[done:done + take])
                    row, done = row + take, done + take
                bar.update(len(block))
        if row != n:
            raise ValueError(f"the shards hold {row} vectors, the index meta says {n}")

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch  # lazy: heavy (torch)

        queries = np.asarray(queries, dtype=np.float32)
        k = max(1, min(k, self.n))
        scores, rows = [], []
        with torch.inference_mode():
            for start, part in zip(self.starts, self.parts):
                s, r = self._search_part(torch.from_numpy(queries).to(part.device), part, k)
                scores.append(s.cpu())
                rows.append(r.cpu() + start)
        scores, rows = torch.cat(scores, 1), torch.cat(rows, 1)
        # Best first; equal scores in row order (as faiss' flat index returns them).
        order = np.lexsort((rows.numpy(), -scores.numpy()), axis=1)[:, :k]
        return (np.take_along_axis(scores.numpy(), order, 1).astype(np.float32),
                np.take_along_axis(rows.numpy(), order, 1).astype(np.int64))

    def _search_part(self, q32, part, k: int):
        """Top candidates of one device's rows: (float32 scores, local rows), [b, <= candidates(k)]."""
        import torch  # lazy: heavy (torch)

        b, m = len(q32), len(part)
        keep = min(m, candidates(k))
        q16 = q32.to(torch.float16)
        chunk = max(keep, min(m, self.max_scores // max(1, b)))
        if self.group > 1 and chunk < m:
            chunk = max(self.group, chunk // self.group * self.group)    # only the last chunk has a tail
        vals, idx = [], []
        for c0 in range(0, m, chunk):
            block = part[c0:c0 + chunk] @ q16.T                       # [c, b] float16 scores
            v, i = chunk_topk(block, min(keep, block.shape[0]), self.group)
            vals.append(v)
            idx.append(i + c0)
        vals, idx = torch.cat(vals, 1), torch.cat(idx, 1)
        if vals.shape[1] > keep:
            sel = vals.topk(keep, dim=1).indices
            idx = idx.gather(1, sel)
        exact = torch.einsum("bkd,bd->bk", part[idx].float(), q32)     # float32 re-score
        return exact, idx


def chunk_topk(scores, keep: int, group: int = GROUP):
    """(values, columns) of the `keep` largest scores per query, best first, from a [c, b] block.

    `scores` holds one chunk's passages along dim 0 and the queries along dim 1 (`part @ q.T`);
    the result is per query: values [b, keep] and passage columns [b, keep] (0 <= column < c).
    Two stages when it pays: the maximum of each group of `group` consecutive passages, the
    `keep` groups with the largest maxima, then the top `keep` of those groups' scores (plus
    the last c mod group passages). Exact: every entry above the keep-th largest value t lies in
    a group whose maximum exceeds t, and fewer than `keep` groups can; the groups with maximum t
    that are chosen hold at least as many entries equal to t as the top-k needs (which of equal
    entries is returned is unspecified, as with torch.topk). The full-size top-k (a radix select
    over all b x c scores on a GPU) becomes one max-reduction, a top-k over c / group maxima and
    one over keep x group gathered scores. Passages along dim 0 make the reduction run across
    groups of whole rows with the queries contiguous: on an H200, 0.25 ms for a [1M, 256] block
    where the same maxima over 64 contiguous columns of a [256, 1M] block took 1.26 ms
    (bench/retrieval_topk_parts.py). `group` <= 1, or too few groups: plain `torch.topk`.
    """
    import torch  # lazy: heavy (torch)

    c, b = scores.shape
    groups = c // group if group > 1 else 0
    if groups <= keep:
        return scores.T.topk(keep, dim=1)
    full = groups * group
    scores = scores if scores.is_contiguous() else scores.contiguous()
    grouped = scores[:full].view(groups, group, b)
    best = grouped.amax(dim=1).T.topk(keep, dim=1).indices                                 # [b, keep]
    values = grouped.permute(2, 0, 1).gather(1, best.unsqueeze(2).expand(b, keep, group))   # [b, keep, group]
    values = values.reshape(b, keep * group)
    cols = (best.unsqueeze(2) * group + torch.arange(group, device=scores.device)).view(b, keep * group)
    if full < c:
        values = torch.cat([values, scores[full:].T], 1)
        cols = torch.cat([cols, torch.arange(full, c, device=scores.device).expand(b, c - full)], 1)
    values, pick = values.topk(keep, dim=1)
    return values, cols.gather(1, pick)
