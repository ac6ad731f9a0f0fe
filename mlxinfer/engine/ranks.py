"""Several processes on MLX's own distributed layer (`mx.distributed`, started by `mlx.launch`):
the group this process belongs to, and the collectives the experiments need. Outside
mlx.launch the group has one rank and these cost nothing.

Ranks either share out the seeds (each runs the whole model) or, when the model is split across
them (`load(..., group=...)`, `--shard-model`), run every seed together: `seed_group` says which."""

from __future__ import annotations

import hashlib
import json

import mlx.core as mx


def group():
    """This process's group (a single rank when not launched by mlx.launch); a rank that cannot reach
    the others gives up with one line (model/distributed.py)."""
    from ..model.distributed import connect

    return connect()


class _Alone:
    """A group of one: what the seeds see when every rank runs all of them."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def seed_group(model):
    """The ranks the seeds are shared among: all of them, unless the model is split across them,
    when every rank takes part in every forward pass and so runs every seed."""
    return _Alone() if getattr(model.info, "sharding", None) else group()


def from_rank0(rows: list, group, failure: Exception | None = None) -> list:
    """Rank 0's JSON-able rows, on every rank. If rank 0 failed (`failure`, an MlxinferError), every
    rank raises its message as the same class (so the same exit code: a full disk is 1 on every rank),
    so that none waits for a rank that stopped."""
    if group.size() > 1:
        sent = gather([{"rows": rows, "error": _sent(failure)}] if group.rank() == 0 else [], group)[0]
        failure = failure or _received(sent["error"])
        rows = sent["rows"]
    if failure is not None:
        raise failure
    return list(rows)


def raise_any(failure: Exception | None, group) -> None:
    """Where any rank failed (`failure`: its MlxinferError, else None), every rank raises: a failing rank its own
    error, the others the first failing rank's (as the same class), so that none goes on to wait for a rank
    that stopped."""
    if group.size() > 1:
        sent = [e for e in gather([_sent(failure)], group) if e is not None]
        failure = failure or (_received(sent[0]) if sent else None)
    if failure is not None:
        raise failure


def _sent(failure: Exception | None):
    from ..errors import OutputError

    if failure is None:
        return None
    return ["output" if isinstance(failure, OutputError) else "input", str(failure), *failure.params]


def _received(error):
    from ..errors import MlxinferError, OutputError

    if error is None:
        return None
    kind, *args = error
    return {"input": MlxinferError, "output": OutputError}[kind](*args)


def identity(model) -> dict:
    """What a rank's model is, as the ranks compare it and a results file records it (the compute path too: it
    moves a seed's text)."""
    cfg, info = model.config, model.info
    return {
        "name": info.name,
        "definition": info.definition,
        "weights": info.weights,
        "compute_dtype": info.compute_dtype,
        "vocab_size": cfg.vocab_size,
        "layers": cfg.num_hidden_layers,
    }


def request_fields(model, request) -> dict:
    """What the ranks compare of a prepared request (engine/request.py's Request) and its model."""
    schema = request.constraint.schema if request.constraint is not None else None
    return {"model": identity(model), "prompt": request.ids, "settings": request.settings.to_dict(),
            "max_tokens": request.max_tokens, "stop": list(request.stop), "json_schema": schema}  # fmt: skip


def agree(request: dict, group) -> None:
    """Every rank runs the same request: its fields (JSON-able) are compared with rank 0's, and where any
    differs every rank stops with one line naming them (was: a rank given another prompt, budget or model
    drew its share of the seeds from it, and the mixed results came back with exit 0)."""
    from ..errors import MlxinferError, first_line

    if group.size() == 1:
        return
    digests = {k: hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()
               for k, v in request.items()}  # fmt: skip
    try:
        every = gather([digests], group)
    except RuntimeError as e:
        why = first_line(e)
        raise MlxinferError(f"rank {group.rank()} lost the other ranks while comparing the request ({why})") from None
    for i, theirs in enumerate(every[1:], start=1):
        differ = [k for k in every[0] if theirs.get(k) != every[0][k]] + [k for k in theirs if k not in every[0]]
        if differ:
            raise MlxinferError(
                f"ranks disagree on the request: rank {i}'s {', '.join(differ)} differ from rank 0's; give every rank "
                "the same command and model (mlx.launch passes one command line to all)"
            )


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
