"""What the grammar mask costs, beside the forward pass (a benchmark, not a test).

Prints, for one schema on one model (default: the lesson's add_to_shopping_list tool on the
embedded SmolLM2-135M, "Put basil on my shopping list.", greedy):

* the token table build (llguidance reads the tokenizer; once per tokenizer per process),
* the schema compile (once per schema and tokenizer; later runs take it from the cache),
* the mask per token: consume the drawn token + compute the bitmask + unpack it, measured
  in the worker thread during generation,
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

    import mlxinfer  # first: the BLAS preload must run before mlx is imported

    import mlx.core as mx

    model, tok = mlxinfer.load(a.model)
    constraint = {"json_schema": a.schema} if a.schema else {"tool": a.tool}

    def run(max_tokens, prompt=a.prompt, **options):
        return mlxinfer.generate(model, tok, prompt, settings=mlxinfer.GREEDY, max_tokens=max_tokens, **options)

    run(4, **constraint)  # warm-up: kernels, the token table, the compiled grammar, first masks
    masked, plain, mask_s, wait_s = [], [], [], []
    for _ in range(a.runs):
        result = run(a.max_tokens, **constraint)
        stats, grammar = result.stats, result.grammar_seconds
        # passes after the first token: one per later token, plus the end of the turn and the
        # step the loop queues after it (the plain run below stops at the budget: no extra passes)
        passes = stats.generated_tokens - 1 + 2 * (stats.finish_reason == "stop")
        masked.append(stats.decode_seconds / max(passes, 1))
        mask_s += grammar["mask_per_step"][1:]  # [0] is the first mask, computed with the prefill
        wait_s += grammar["wait_per_step"][1:]
        same_prompt = run(len(result.tokens), result.prompt_ids)  # the same ids (the tool's system message too)
        plain.append(same_prompt.stats.decode_seconds / max(same_prompt.stats.generated_tokens - 1, 1))

    ms = 1e3
    med = statistics.median
    print(f"model: {model.info.name}; {model.config.vocab_size:,} output rows")
    print(f"output ({result.finish_reason}, {len(result.tokens)} tokens): {result.text}")
    print(f"token table build (once per tokenizer):   {grammar['token_table'] * ms:9.1f} ms")
    print(f"schema compile (once per schema):          {grammar['compile'] * ms:9.2f} ms")
    print(f"mask per token, during generation:         {med(mask_s) * ms:9.3f} ms median, {max(mask_s) * ms:.3f} max")
    print(f"wait for the mask after starting the pass: {med(wait_s) * ms:9.3f} ms median")
    print(f"decode per token without the mask:         {med(plain) * ms:9.1f} ms (forward pass + draw)")
    print(f"decode per token with the mask:            {med(masked) * ms:9.1f} ms (forward pass + mask + draw)")
    print(f"mask / forward pass:                       {med(mask_s) / med(plain) * 100:9.2f} %")
    print(f"(mx {mx.__version__}, {a.runs} runs each, greedy; timings move with other load on the machine)")


if __name__ == "__main__":
    main()
