"""`mlxinfer generate`: stream text from the model, then the stats of the run."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from cli.app import app
from cli.common import (
    FrequencyOption, JsonOption, MinPOption, ModelOption, OrderOption, PresenceOption, RepetitionOption,
    TempOption, TopKOption, TopPOption, print_json, user_sampling,
)


@app.command("generate")
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="The text the model reads."),
    model: Optional[str] = ModelOption,
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
    json_out: bool = JsonOption,
):
    """Generate text: prefill the prompt into the KV cache, then one forward pass per token."""
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
    m, tok = load(model)
    settings, note = resolve_settings(user, m.generation_config)
    ids = encode_prompt(tok, prompt, chat=chat, system=system, thinking=thinking)
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
