"""What test_shard.py compares between one process and N ranks: run alone, or under mlx.launch.

    python tests/shard_worker.py MODEL OUT_DIR      (MODEL "embedded" for the embedded model)

Every rank runs the same calls (a split model needs all of them in every forward pass); rank 0
writes OUT_DIR/result.json and the last-position logits, OUT_DIR/logits_<i>.npy. The float32 path
gives the logits and greedy tokens, the weights as stored the seeded sample texts; both, the bytes
each rank holds. For a checkpoint directory also mlx-lm's own model class on the same weights, split
by its own `shard(group)` (OUT_DIR/mlx_lm_logits_<i>.npy).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mlxinfer, not an installed one

import mlxinfer  # noqa: E402  (first: it loads a fast BLAS before mlx)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlxinfer.engine.ranks import group  # noqa: E402
from mlxinfer.model.peers import mlx_lm_twin  # noqa: E402
from mlxinfer.model.shard import shard  # noqa: E402
from mlxinfer.tokenizer import encode_prompt  # noqa: E402

PROMPTS = ["Name one fruit. Answer with one word.", "Name one herb to add to tomato soup. Answer with one word."]


def main(model: str, out: Path) -> None:
    g = group()
    result = {"ranks": g.size(), "paths": {}}
    for path in ("float32", "bfloat16"):
        mx.clear_cache()
        m, tok = mlxinfer.load(None if model == "embedded" else model, path, group=g if g.size() > 1 else None)
        held = {
            "weight_bytes": sum(p.nbytes for _, p in mlx_params(m)),
            "active_bytes": mx.get_active_memory(),
            "sharding": m.info.sharding,
            "weights": m.info.weights,
        }
        if path == "float32":  # logits and greedy tokens: float32 activations, so 1e-4 is a fair bound
            held["greedy"] = []
            for i, prompt in enumerate(PROMPTS):
                ids = encode_prompt(tok, prompt)
                logits = m(mx.array(ids)[None])[0, -1].astype(mx.float32)  # (V,)
                mx.eval(logits)  # on every rank: each rank's all_sums must run in the same order
                if g.rank() == 0:
                    np.save(out / f"logits_{i}.npy", np.array(logits))
                held["greedy"].append(mlxinfer.generate(m, tok, prompt, settings=mlxinfer.GREEDY, max_tokens=12).tokens)
        else:  # seeded draws, weights as stored: a row's bits do not depend on its batch there
            report = mlxinfer.sample(m, tok, PROMPTS[1], seeds=10, settings={"temperature": 1.0}, max_tokens=5)
            held["sample"] = [c.text for c in report.completions]
        result["paths"][path] = held
        del m
    if model != "embedded":  # mlx-lm's own class, split by its own shard() through our hook
        m, tok = mlxinfer.load(model, "float32")
        twin = mlx_lm_twin(m)
        twin.info = m.info
        if g.size() > 1:
            shard(twin, g)
        for i, prompt in enumerate(PROMPTS):
            logits = twin(mx.array(encode_prompt(tok, prompt))[None])[0, -1].astype(mx.float32)  # (V,)
            mx.eval(logits)
            if g.rank() == 0:
                np.save(out / f"mlx_lm_logits_{i}.npy", np.array(logits))
    if g.rank() == 0:
        (out / "result.json").write_text(json.dumps(result))


def mlx_params(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
