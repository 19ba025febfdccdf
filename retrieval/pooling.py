"""Token states -> one vector per text (mean, CLS or last-token pooling), for every encoder runtime."""
from __future__ import annotations


def pool(hidden, mask, how: str):
    """[b, L, d] token states + [b, L] attention mask -> [b, d] one vector per text."""
    import torch  # lazy: heavy (torch)

    if how == "mean":
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
    if how == "cls":
        return hidden[:, 0]
    if how == "last":
        # Index of the last real token per row: right or left padding both work.
        positions = mask.cumsum(1).argmax(1)                 # [b]
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), positions]
    raise ValueError(f"unknown pooling {how!r}; use mean, cls or last")
