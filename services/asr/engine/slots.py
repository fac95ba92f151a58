"""Per-stream state pooled in tensors with one row per cache slot (encoder caches, decoder state): the rows
of a step's streams are read and written back together."""

from __future__ import annotations

import torch


def rows(slots: list[int], device) -> slice | torch.Tensor:
    """The pool rows of `slots`: a slice when they are consecutive (streams admitted together usually are),
    read as a view instead of a gathered copy."""
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return upload(torch.tensor(slots), device)


def upload(tensor: torch.Tensor, device) -> torch.Tensor:
    """`tensor` (on the host) on `device`. To a GPU through pinned memory, without waiting: a copy from pageable
    memory waits for everything queued on the stream first, so a step launched while the previous one runs
    (overlapped steps, batching.py) would wait for it at its first upload."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def gather(pool: torch.Tensor, dim: int, at: slice | torch.Tensor) -> torch.Tensor:
    if isinstance(at, slice):
        return pool.narrow(dim, at.start, at.stop - at.start)
    return pool.index_select(dim, at)


def scatter(pool: torch.Tensor, dim: int, at: slice | torch.Tensor, values: torch.Tensor) -> None:
    if isinstance(at, slice):
        pool.narrow(dim, at.start, at.stop - at.start).copy_(values)
    else:
        pool.index_copy_(dim, at, values)


def join_history(pool: torch.Tensor, at: slice | torch.Tensor, frames: torch.Tensor, history: int) -> torch.Tensor:
    """The last `history` pre-encode frames of the slots `at` (pool [slots, mel, keep]) then their new mel `frames`
    [B, mel, T], as one batch; the slots' kept frames move on to the last `keep` of that. A few batched calls, none
    per stream (the same in a padded step's graph, with `at` its slot tensor)."""
    keep = pool.shape[2]
    joined = torch.cat((gather(pool, 0, at), frames), dim=2)
    scatter(pool, 0, at, joined[:, :, -keep:])
    return joined[:, :, keep - history :]
