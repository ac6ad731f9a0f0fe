"""Several processes on MLX's own distributed layer (`mx.distributed`, started by `mlx.launch`):
the group this process belongs to, and the two collectives the experiments need. Outside
mlx.launch the group has one rank and these cost nothing."""

from __future__ import annotations

import json

import mlx.core as mx


def group():
    """This process's group (a single rank when not launched by mlx.launch)."""
    return mx.distributed.init()


def share(items: list, group) -> list:
    """This rank's deterministic share: every N-th item, starting at the rank."""
    return items[group.rank() :: group.size()]


def gather(rows: list, group) -> list:
    """Every rank's JSON-able rows, on every rank, in rank order: lengths first, then the bytes
    padded to the longest (all_gather needs one shape on every rank)."""
    import numpy as np

    if group.size() == 1:
        return list(rows)
    payload = json.dumps(rows, allow_nan=False).encode()
    lengths = mx.distributed.all_gather(mx.array([len(payload)], dtype=mx.int32), group=group).tolist()
    buffer = np.zeros((1, max(lengths)), np.uint8)
    buffer[0, : len(payload)] = np.frombuffer(payload, np.uint8)
    gathered = np.array(mx.distributed.all_gather(mx.array(buffer), group=group))
    return [r for i, n in enumerate(lengths) for r in json.loads(gathered[i, :n].tobytes())]


def barrier(group) -> None:
    mx.eval(mx.distributed.all_sum(mx.array([1.0]), group=group))
