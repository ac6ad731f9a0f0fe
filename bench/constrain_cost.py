"""What the grammar mask costs, beside the forward pass (a benchmark, not a test).

Prints, for one schema on one model (default: the lesson's add_to_shopping_list tool on the
embedded SmolLM2-135M, "Put basil on my shopping list.", greedy):

* the token table build (llguidance reads the tokenizer; once per tokenizer per process),
* the schema compile (first time, then from the cache),
* the mask per token: consume the drawn token + compute the bitmask + unpack it, measured
  in the worker thread during generation and again replayed alone (no model running),
* how long each step waited for its mask after starting the forward pass (the part of
  the mask that the pass did not hide),
* the decode time per token with the mask and without it (same prompt, same token count).

    python bench/constrain_cost.py
    python bench/constrain_cost.py --schema examples/oven_readings.json --prompt "Log 180 and 185 C." --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model source (default: the embedded SmolLM2-135M)")
    p.add_argument("--tool", default=str(REPO / "examples" / "add_to_shopping_list.json"))
    p.add_argument("--schema", default=None, help="a JSON Schema file instead of --tool")
    p.add_argument("--prompt", default="Put basil on my shopping list.")
    p.add_argument("--runs", type=int, default=2, help="generations with and without the mask")
    p.add_argument("--max-tokens", type=int, default=64)
    a = p.parse_args()

    import mlx.core as mx

    from mlxinfer.constrain import compile_schema, finish, load_schema, load_tool, token_table, tool_system
    from mlxinfer.generate import Stats, collect, generate_steps, greedy
    from mlxinfer.loading import load
    from mlxinfer.tokenizer import encode_prompt

    model, tok = load(a.model)
    system = None
    if a.schema:
        schema = load_schema(a.schema)
    else:
        tool, schema = load_tool(a.tool)
        system = tool_system(tool)
    ids = encode_prompt(tok, a.prompt, system=system)

    table = token_table(tok)
    t0 = time.perf_counter()
    compiled = compile_schema(tok, schema)
    first_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    compile_schema(tok, schema)
    cached_compile = time.perf_counter() - t0

    def generate(mask=None, max_tokens=a.max_tokens):
        stats = Stats()
        kw = {"processors": [mask], "stop_ids": mask.stop_ids} if mask else {}
        gen = collect(generate_steps(model, tok, ids, greedy, max_tokens=max_tokens, stats=stats, **kw), stats)
        return gen, stats

    generate(compiled.mask(model.config.vocab_size), max_tokens=4)  # warm-up: kernels, first masks
    masked, plain, mask_s, wait_s = [], [], [], []
    for _ in range(a.runs):
        mask = compiled.mask(model.config.vocab_size)
        gen, stats = generate(mask)
        result = finish(mask, gen.text, gen.tokens, stats.finish_reason)
        n = len(gen.tokens)
        # passes after the first token: one per later token, plus the end of the turn and the
        # step the loop queues after it (the plain run below stops at the budget: no extra passes)
        passes = stats.generated_tokens - 1 + 2 * (stats.finish_reason == "stop")
        masked.append(stats.decode_seconds / max(passes, 1))
        mask_s += mask.mask_seconds[1:]  # [0] is the first mask, computed with the prefill
        wait_s += mask.wait_seconds[1:]
        _, pstats = generate(None, max_tokens=n)
        plain.append(pstats.decode_seconds / max(pstats.generated_tokens - 1, 1))

    # replay the same tokens with no model running: the mask's own CPU time
    replay = []
    for _ in range(5):
        mask = compiled.mask(model.config.vocab_size)
        for i in range(len(gen.tokens) + 1):
            t0 = time.perf_counter()
            if i:
                mask.advance(gen.tokens[:i])
            mask.allowed()
            replay.append(time.perf_counter() - t0)

    ms = 1e3
    med = statistics.median
    print(f"model: {model.source.name}; vocabulary {table.n_vocab:,} tokens, {model.config.vocab_size:,} output rows")
    print(f"output ({result.finish_reason}, {n} tokens): {result.text}")
    print(f"token table build (once per tokenizer):   {table.build_seconds * ms:9.1f} ms")
    print(f"schema compile, first / cached:            {first_compile * ms:9.2f} ms / {cached_compile * ms:.3f} ms")
    print(f"mask per token, during generation:         {med(mask_s) * ms:9.3f} ms median, {max(mask_s) * ms:.3f} max")
    print(f"mask per token, replayed alone:            {med(replay) * ms:9.3f} ms median, {max(replay) * ms:.3f} max")
    print(f"wait for the mask after starting the pass: {med(wait_s) * ms:9.3f} ms median")
    print(f"decode per token without the mask:         {med(plain) * ms:9.1f} ms (forward pass + draw)")
    print(f"decode per token with the mask:            {med(masked) * ms:9.1f} ms (forward pass + mask + draw)")
    print(f"mask / forward pass:                       {med(mask_s) / med(plain) * 100:9.2f} %")
    print(f"(mx {mx.__version__}, {a.runs} runs each, greedy; timings move with other load on the machine)")


if __name__ == "__main__":
    main()
