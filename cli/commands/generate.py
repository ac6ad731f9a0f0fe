"""`mlxinfer generate`: stream text from the model, then the stats of the run."""

from __future__ import annotations

import math
import secrets
import sys
from typing import Optional

import typer

from mlxinfer import defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import counted, load_model, other_rank, print_json, sharding_line, stdout_console
from mlxinfer_cli.options import chat_kwargs, max_tokens_option, settings, stop, takes


@takes("prompt", "model", "chat", "sampling", "penalties", "schema", "stop", "json")
def generate(
    max_tokens: int = max_tokens_option(defaults.MAX_TOKENS_GENERATE, "Stop after this many new tokens."),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Seed the draws (default: one drawn and shown); a seed repeats its text."
    ),
    logprobs: int = typer.Option(0, "--logprobs", help="Show each token's logprob and the K best alternatives."),
    explain_mask: bool = typer.Option(
        False,
        "--explain-mask",
        help="With --json-schema/--tool: per step, how many tokens the grammar allows, "
        "the best allowed token and the best refused one with its score.",
    ),
    **options,
):
    """Generate text: prefill the prompt into the KV cache, then one forward pass per token.

    With --json-schema or --tool a grammar mask sets every token that would break the schema to
    -inf before the draw: the output is compact JSON of the schema's shape; the values are the
    model's choice. If --max-tokens cuts it, the JSON is not valid: a warning and exit code 1.

    Under mlx.launch the model is split across the ranks (tensor parallelism); rank 0 prints.
    """
    import mlxinfer

    sampling = settings(options)
    stops = stop(options)
    schema = {"json_schema": options["json_schema"], "tool": options["tool"]}
    mlxinfer.Constraint.read(**schema, explain_mask=explain_mask)  # a bad schema fails before the model loads
    mlxinfer.check_max_tokens(max_tokens)  # so do these (refused a second or two later, once it had loaded)
    mlxinfer.check_seed(seed)
    m, tok = load_model(options["model"], options["compute_dtype"])
    quiet = other_rank()  # under mlx.launch rank 0 prints for every rank
    if seed is None and mlxinfer.launch_group().size() == 1:  # a seed drawn and shown, as chat does: the run repeats
        seed = secrets.randbelow(defaults.FRESH_SEEDS)  # (every rank of a launch draws from one stream: left alone)
    stream = mlxinfer.stream_generate(
        m,
        tok,
        options["prompt"],
        settings=sampling,
        max_tokens=max_tokens,
        seed=seed,
        stop=stops,
        logprobs=logprobs,
        explain_mask=explain_mask,
        **schema,
        **chat_kwargs(options),
    )
    json_out = options["json_out"]
    shown = False
    try:
        for i, step in enumerate(stream):
            if not json_out and not quiet:
                if i == 0:  # once the prefill has worked: an error before it stays the one line on stderr
                    shown_seed = f" [seed {stream.seed}]" if stream.seed is not None else ""  # greedy: none
                    print(f"[{m.info.name} on {m.info.definition}]{shown_seed} {stream.note}", file=sys.stderr)
                    if m.info.sharding:
                        print(sharding_line(m.info.sharding), file=sys.stderr)
                shown = True  # before the write: text that reaches the terminal is always marked after
                sys.stdout.write(step.text)
                sys.stdout.flush()
    except KeyboardInterrupt:  # what was written so far is the result, finish_reason "interrupted", as chat's
        result = stream.stop()
        if quiet:
            raise typer.Exit(130) from None
        if json_out:
            print_json(result.to_dict())
        else:  # a terminal's line is marked, as chat marks a stopped reply; a pipe's text stays the model's
            if shown and sys.stdout.isatty():
                sys.stdout.write(" [stopped]")
            sys.stdout.write("\n" if shown else "")
            sys.stdout.flush()
            print(stats_line(result.stats) + ("" if sys.stdout.isatty() else " (stopped by Ctrl-C)"), file=sys.stderr)
        raise typer.Exit(130) from None
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
    if stats.finish_reason == "interrupted" and not stats.generated_tokens:
        return f"prompt {counted(stats.prompt_tokens, 'token')} | stopped during the prefill | finish: interrupted"
    # the first token is drawn from the prefill's scores: with no other, no decode step ran to time
    rate = f"at {stats.decode_tokens_per_s:.1f} tok/s" if stats.generated_tokens > 1 else "with the prefill"
    return (
        f"prompt {counted(stats.prompt_tokens, 'token')} at {stats.prefill_tokens_per_s:.1f} tok/s | "
        f"generated {counted(stats.generated_tokens, 'token')} {rate} | "
        f"peak memory {stats.peak_memory_bytes / 1e6:.0f} MB | finish: {stats.finish_reason}"
    )


def render_mask(rows: list[dict]) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console = stdout_console()
    if not console.is_terminal:
        console = stdout_console(width=120)
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
    from mlxinfer_cli.common import folding_table as Table

    t = Table(title="logprobs: the model's own (T = 1, nothing cut), whatever the sampler's settings")
    t.add_column("token")
    t.add_column("logprob", justify="right")
    t.add_column("p", justify="right")
    t.add_column("alternatives")
    for s in steps:
        alts = "\n".join(f"{a.text!r} {a.logprob:.3f}" for a in s.alternatives)  # one a line: a fold never splits one
        t.add_row(repr(s.token_text), f"{s.logprob:.3f}", f"{math.exp(s.logprob):.3f}", alts)
    stdout_console().print(t)
