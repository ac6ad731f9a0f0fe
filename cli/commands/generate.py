"""`mlxinfer generate`: stream text from the model, then the stats of the run."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from cli.app import app
from cli.common import (
    ComputeOption, FrequencyOption, JsonOption, MinPOption, ModelOption, OrderOption, PresenceOption, RepetitionOption,
    TempOption, TopKOption, TopPOption, print_json, user_sampling,
)


@app.command("generate")
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="The text the model reads."),
    model: Optional[str] = ModelOption,
    compute_dtype: str = ComputeOption,
    system: Optional[str] = typer.Option(None, "--system", help="A system message for the chat template."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="Stop after this many new tokens."),
    temp: Optional[float] = TempOption,
    top_p: Optional[float] = TopPOption,
    top_k: Optional[int] = TopKOption,
    min_p: Optional[float] = MinPOption,
    repetition_penalty: Optional[float] = RepetitionOption,
    presence_penalty: Optional[float] = PresenceOption,
    frequency_penalty: Optional[float] = FrequencyOption,
    order: Optional[str] = OrderOption,
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed MLX's random draws; the same seed repeats the text."),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="Wrap the prompt in the model's chat template."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Qwen3's thinking switch."),
    logprobs: int = typer.Option(0, "--logprobs", help="Show each token's logprob and the K best alternatives."),
    json_schema: Optional[str] = typer.Option(
        None, "--json-schema",
        help="Constrain the output to this JSON Schema (a file or inline JSON; top level an object)."),
    tool: Optional[str] = typer.Option(
        None, "--tool", help="Write the input of this tool (Anthropic format: name, description, strict, input_schema; "
        "a file or inline JSON) as compact JSON. Without --system, the system message names the tool."),
    explain_mask: bool = typer.Option(
        False, "--explain-mask", help="With --json-schema/--tool: per step, how many tokens the grammar allows, "
        "the best allowed token and the best refused one with its score."),
    json_out: bool = JsonOption,
):
    """Generate text: prefill the prompt into the KV cache, then one forward pass per token.

    With --json-schema or --tool a grammar mask sets every token that would break the schema to
    -inf before the draw: the output is compact JSON of the schema's shape; the values are the
    model's choice. If --max-tokens cuts it, the JSON is not valid: a warning and exit code 1.
    """
    import mlx.core as mx

    from mlxinfer.errors import MlxinferError
    from mlxinfer.generate import Stats, collect, generate_steps
    from mlxinfer.loading import load
    from mlxinfer.sampler import make_logits_processors, make_sampler, resolve_settings
    from mlxinfer.tokenizer import encode_prompt

    if logprobs < 0:
        raise MlxinferError(f"--logprobs must be >= 0, got {logprobs}")
    if max_tokens < 1:
        raise MlxinferError(f"--max-tokens must be at least 1, got {max_tokens}")
    user = user_sampling(temp, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, order)
    schema, tool_def = read_constraint(json_schema, tool, explain_mask)  # bad files fail before the model loads
    if tool_def is not None and system is None:
        from mlxinfer.constrain import tool_system

        system = tool_system(tool_def)
    m, tok = load(model, compute_dtype)
    settings, note = resolve_settings(user, m.generation_config)
    ids = encode_prompt(tok, prompt, chat=chat, system=system, thinking=thinking)
    if schema is not None:
        return generate_json(m, tok, ids, settings, note, schema, tool_def, max_tokens=max_tokens, seed=seed,
                             logprobs=logprobs, explain=explain_mask, json_out=json_out)
    if seed is not None:
        mx.random.seed(seed)
    stats = Stats()
    steps = generate_steps(
        m, tok, ids, make_sampler(settings), max_tokens=max_tokens,
        processors=make_logits_processors(settings), logprobs=logprobs, stats=stats,
    )
    if json_out:
        result = collect(steps, stats, {**settings.to_dict(), "note": note, "seed": seed})
        print_json({"model": m.source.name, "prompt_ids": ids, **result.to_dict()})
        return
    err = sys.stderr
    print(f"[{m.source.name}] {note}", file=err)
    kept = []
    for step in steps:
        sys.stdout.write(step.text)
        sys.stdout.flush()
        kept.append(step)
    sys.stdout.write("\n")
    if logprobs:
        render_logprobs([s for s in kept if s.token >= 0])
    render_stats(stats, err)


def read_constraint(json_schema, tool, explain_mask):
    """-> (schema or None, tool definition or None); one-line errors for bad input."""
    from mlxinfer.constrain import load_schema, load_tool
    from mlxinfer.errors import MlxinferError

    if json_schema is not None and tool is not None:
        raise MlxinferError("pass --json-schema or --tool, not both")
    if explain_mask and json_schema is None and tool is None:
        raise MlxinferError("--explain-mask needs --json-schema or --tool")
    if tool is not None:
        return load_tool(tool)[::-1]
    return (load_schema(json_schema) if json_schema is not None else None), None


def generate_json(m, tok, ids, settings, note, schema, tool_def, *, max_tokens, seed, logprobs, explain, json_out):
    """The constrained run: compile (before any forward pass), mask every step, check the end."""
    import inspect

    import mlx.core as mx

    from mlxinfer.constrain import compile_schema, finish
    from mlxinfer.generate import Stats, collect, generate_steps
    from mlxinfer.sampler import make_logits_processors, make_sampler

    where = "--tool input_schema" if tool_def is not None else "--json-schema"
    compiled = compile_schema(tok, schema, where)
    mask = compiled.mask(m.config.vocab_size, explain=explain)
    if seed is not None:
        mx.random.seed(seed)
    stats = Stats()
    # the loop's "grammar done" hook, where generate_steps has one: it saves the pass after the JSON closes
    hook = {"should_stop": mask.should_stop} if "should_stop" in inspect.signature(generate_steps).parameters else {}
    steps = generate_steps(
        m, tok, ids, make_sampler(settings), max_tokens=max_tokens,
        processors=make_logits_processors(settings) + [mask], logprobs=logprobs, stats=stats,
        stop_ids=mask.stop_ids, **hook,
    )
    err = sys.stderr
    if not json_out:
        print(f"[{m.source.name}] {note}", file=err)
    kept = []
    for step in steps:
        if not json_out:
            sys.stdout.write(step.text)
            sys.stdout.flush()
        kept.append(step)
    gen = collect(iter(kept), stats, {**settings.to_dict(), "note": note, "seed": seed})
    result = finish(mask, gen.text, gen.tokens, stats.finish_reason)
    stats.finish_reason = result.finish_reason
    rows = mask.explained() if explain else []
    if json_out:
        out = {"model": m.source.name, "prompt_ids": ids, **gen.to_dict(), "parsed": result.parsed,
               "valid": result.valid, "finish_reason": result.finish_reason, "warning": result.warning,
               "tool": tool_def["name"] if tool_def is not None else None,
               "schema_compile_seconds": compiled.compile_seconds}
        if explain:
            out["mask_steps"] = [r.to_dict() for r in rows]
        print_json(out)
    else:
        sys.stdout.write("\n")
        if logprobs:
            render_logprobs([s for s in kept if s.token >= 0])
        if explain:
            render_mask(rows)
        render_stats(stats, err)
    if not result.valid:
        print(f"warning: {result.warning}", file=err)
        raise typer.Exit(1)


def render_mask(rows) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    t = Table(title="grammar mask: what each step allowed (scores before the mask and the temperature)")
    t.add_column("step", justify="right")
    t.add_column("written so far", no_wrap=True)
    t.add_column("allowed", justify="right")
    t.add_column("drawn")
    t.add_column("best allowed")
    t.add_column("best refused")

    def show(text: str) -> str:
        r = repr(text)
        return r if len(r) <= 16 else r[:14] + "…" + r[-1]

    for r in rows:
        so_far = r.text if len(r.text) <= 36 else "…" + r.text[-35:]
        drawn = "(end of turn)" if r.chosen_id < 0 else show(r.chosen_text)
        refused = f"{show(r.refused_text)} {r.refused_score:.2f}" if r.refused_id >= 0 else "(none)"
        best = f"{show(r.allowed_text)} {r.allowed_score:.2f}"
        t.add_row(str(r.step), so_far, f"{r.n_allowed:,}", drawn, best, refused)
    console.print(t)


def render_logprobs(steps) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="logprobs")
    t.add_column("token")
    t.add_column("logprob", justify="right")
    t.add_column("p", justify="right")
    t.add_column("alternatives")
    for s in steps:
        alts = "  ".join(f"{a['text']!r} {a['logprob']:.3f}" for a in s.alternatives)
        from math import exp

        t.add_row(repr(s.text), f"{s.logprob:.3f}", f"{exp(s.logprob):.3f}", alts)
    Console().print(t)


def render_stats(stats, err) -> None:
    print(
        f"prompt {stats.prompt_tokens} tokens at {stats.prefill_tokens_per_s:.1f} tok/s | "
        f"generated {stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s | "
        f"peak memory {stats.peak_memory_bytes / 1e6:.0f} MB | finish: {stats.finish_reason}",
        file=err,
    )
