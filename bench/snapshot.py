"""What the engine writes, as bytes to compare across commits: a refactor must leave them unchanged.

    python bench/snapshot.py --out before.json          # at the old commit
    python bench/snapshot.py --out after.json           # at the new one
    python bench/snapshot.py --compare before.json after.json

On the embedded model, for each compute path (the default `auto`, the weights as stored, int8): `sample`
(20 seeds at three settings), `generate` at temperature 0 with logprobs, `sweep` records, the next-token
table, and one seeded request to the server (two rows, streamed). Timings, speeds and memory are
dropped; everything else (texts, token ids, log-probabilities, tallies) is kept to the last bit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import mlxinfer

HERB = "Name one herb to add to tomato soup. Answer with one word."
FRUIT = "Name one fruit. Answer with one word."
SETTINGS = [{"temperature": 0.7}, {"temperature": 1.0, "top_p": 0.9}, {"temperature": 1.5, "top_k": 20}]
PATHS = ("auto", "bfloat16", "int8")
VOLATILE = ("seconds", "per_s", "memory", "time", "elapsed", "created", "id", "system_fingerprint")


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not any(w in k for w in VOLATILE)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _server_request(model, tok) -> list:
    import httpx

    app = mlxinfer.create_app(model, tok, max_rows=4)
    body = {
        "model": app.engine.model_id,
        "messages": [{"role": "user", "content": FRUIT}],
        "seed": 7,
        "n": 2,
        "max_tokens": 8,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 2,
    }

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            plain = (await client.post("/v1/chat/completions", json=body)).json()
            streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
            return [plain, streamed.text.splitlines()]

    import asyncio

    try:
        plain, lines = asyncio.run(go())
    finally:
        app.engine.batcher.close()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return [plain["choices"], [c.get("choices") for c in chunks]]


def snapshot() -> dict:
    out = {}
    for path in PATHS:
        model, tok = mlxinfer.load(None, compute_dtype=path)
        record = {"compute_dtype": model.info.compute_dtype}
        record["sample"] = [
            mlxinfer.sample(model, tok, HERB, seeds=20, settings=s, max_tokens=6).to_dict() for s in SETTINGS
        ]
        record["generate"] = mlxinfer.generate(
            model, tok, HERB, settings={"temperature": 0.0}, max_tokens=12, logprobs=3
        ).to_dict()
        with tempfile.TemporaryDirectory() as tmp:
            report = mlxinfer.sweep(
                model, tok, [HERB, FRUIT], settings=SETTINGS[:2], seeds=6, max_tokens=4, out=f"{tmp}/r.jsonl"
            )
            with open(f"{tmp}/r.jsonl", encoding="utf-8") as f:
                record["sweep_file"] = [json.loads(line) for line in f]
        record["sweep"] = {k: v for k, v in report.to_dict().items() if k != "out"}  # a temporary path
        record["topk"] = mlxinfer.next_token_table(model, tok, HERB, k=10).to_dict()
        record["server"] = _server_request(model, tok)
        out[path] = _stable(record)
    return out


def compare(a: dict, b: dict, where: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{where}: {type(a).__name__} -> {type(b).__name__}"]
    if isinstance(a, dict):
        diffs = [f"{where}.{k}: only before" for k in a.keys() - b.keys()]
        diffs += [f"{where}.{k}: only after" for k in b.keys() - a.keys()]
        for k in a.keys() & b.keys():
            diffs += compare(a[k], b[k], f"{where}.{k}")
        return diffs
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items -> {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in compare(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} -> {b!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the snapshot here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two snapshots to compare")
    args = parser.parse_args()
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            diffs = compare(json.load(f), json.load(g))
        print("\n".join(diffs[:50]) if diffs else "the same")
        return 1 if diffs else 0
    data = snapshot()
    text = json.dumps(data, sort_keys=True, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
