"""`mlxinfer generate`: stream text from the model, then the stats of the run."""

from __future__ import annotations

import math
import sys
from typing import Optional

import typer

from cli import flags
from cli.common import (
    ChatOption,
    ComputeOption,
    FrequencyOption,
    JsonOption,
    MinPOption,
    ModelOption,
    OrderOption,
    PresenceOption,
    PromptOption,
    RepetitionOption,
    SystemOption,
    TempOption,
    RawSpecialOption,
    ThinkingOption,
    TopKOption,
    TopPOption,
    load_model,
    other_rank,
    print_json,
    sampling,
    sharding_line,
)


def generate(
    prompt: str = PromptOption,
    model: Optional[str] = ModelOption,
    compute_dtype: str = ComputeOption,
    system: Optional[str] = SystemOption,
    max_tokens: int = typer.Option(256, "--max-tokens", help="Stop after this many new tokens."),
    temp: Optional[float] = TempOption,
    top_p: Optional[float] = TopPOption,
    top_k: Optional[int] = TopKOption,
    min_p: Optional[float] = MinPOption,
    repetition_penalty: Optional[float] = RepetitionOption,
    presence_penalty: Optional[float] = PresenceOption,
    frequency_penalty: Optional[float] = FrequencyOption,
    order: Optional[str] = OrderOption,
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed the draws; the same seed repeats the text."),
    chat: bool = ChatOption,
    thinking: bool = ThinkingOption,
    raw_special_tokens: bool = RawSpecialOption,
    logprobs: int = typer.Option(0, "--logprobs", help="Show each token's logprob and the K best alternatives."),
    json_schema: Optional[str] = typer.Option(
        None,
        "--json-schema",
        help="Constrain the output to this JSON Schema (a file or inline JSON; top level an object).",
    ),
    tool: Optional[str] = typer.Option(
        None,
        "--tool",
        help="Write the input of this tool (Anthropic format: name, description, strict, input_schema; "
        "a file or inline JSON) as compact JSON. Without --system, the system message names the tool.",
    ),
    explain_mask: bool = typer.Option(
        False,
        "--explain-mask",
        help="With --json-schema/--tool: per step, how many tokens the grammar allows, "
        "the best allowed token and the best refused one with its score.",
    ),
    json_out: bool = JsonOption,
):
    """Generate text: prefill the prompt into the KV cache, then one forward pass per token.

    With --json-schema or --tool a grammar mask sets every token that would break the schema to
    -inf before the draw: the output is compact JSON of the schema's shape; the values are the
    model's choice. If --max-tokens cuts it, the JSON is not valid: a warning and exit code 1.

    Under mlx.launch the model is split across the ranks (tensor parallelism); rank 0 prints.
    """
    import mlxinfer
    from mlxinfer.engine.schema import Constraint

    settings = sampling(temp, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, order)
    Constraint.read(json_schema, tool, explain_mask)  # a bad schema fails before the model loads
    m, tok = load_model(model, compute_dtype)
    quiet = other_rank()  # under mlx.launch rank 0 prints for every rank
    stream = mlxinfer.stream_generate(
        m,
        tok,
        prompt,
        settings=settings,
        max_tokens=max_tokens,
        seed=seed,
        json_schema=json_schema,
        tool=tool,
        logprobs=logprobs,
        chat=chat,
        system=system,
        thinking=thinking,
        raw_special_tokens=raw_special_tokens,
        explain_mask=explain_mask,
    )
    for i, step in enumerate(stream):
        if not json_out and not quiet:
            if i == 0:  # once the prefill has worked: an error before it stays the one line on stderr
                print(f"[{m.info.name} on {m.info.definition}] {stream.note}", file=sys.stderr)
                if m.info.sharding:
                    print(sharding_line(m.info.sharding), file=sys.stderr)
            sys.stdout.write(step.text)
            sys.stdout.flush()
    result = stream.result
    if quiet:
        raise typer.Exit(1 if result.valid is False else 0)
    if json_out:
        print_json(result.to_dict())
    else:
        sys.stdout.write("\n")
        if logprobs:
            render_logprobs(result.steps)
        if result.mask_steps is not None:
            render_mask(result.mask_steps)
        print(stats_line(result.stats), file=sys.stderr)
    if result.valid is False:
        print(f"warning: {flags.named(result.warning, 'max_tokens')}", file=sys.stderr)
        raise typer.Exit(1)


def stats_line(stats) -> str:
    return (
        f"prompt {stats.prompt_tokens} tokens at {stats.prefill_tokens_per_s:.1f} tok/s | "
        f"generated {stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s | "
        f"peak memory {stats.peak_memory_bytes / 1e6:.0f} MB | finish: {stats.finish_reason}"
    )


def render_mask(rows: list[dict]) -> None:
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
        so_far = r["text"] if len(r["text"]) <= 36 else "…" + r["text"][-35:]
        drawn = "(end of turn)" if r["chosen_id"] < 0 else show(r["chosen_text"])
        refused = f"{show(r['refused_text'])} {r['refused_score']:.2f}" if r["refused_id"] >= 0 else "(none)"
        best = f"{show(r['allowed_text'])} {r['allowed_score']:.2f}"
        t.add_row(str(r["step"]), so_far, f"{r['n_allowed']:,}", drawn, best, refused)
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
        alts = "  ".join(f"{a.text!r} {a.logprob:.3f}" for a in s.alternatives)
        t.add_row(repr(s.text), f"{s.logprob:.3f}", f"{math.exp(s.logprob):.3f}", alts)
    Console().print(t)
