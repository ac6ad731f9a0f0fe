"""`mlxinfer tokens`: the prompt token by token, each with the probability the model gave it."""

from __future__ import annotations

import math

import typer

from mlxinfer_cli.common import counted, load_model, other_rank, print_json, stdout_console
from mlxinfer_cli.options import chat_kwargs, takes


@takes("prompt", "model", "chat", "json")
def tokens(
    top: int = typer.Option(1, "--top", min=0, max=20, help="The model's best guesses listed at each position."),
    **options,
):
    """Read the prompt token by token: how the tokenizer splits it, each token's probability given the tokens
    before it (temperature 1), its rank among the vocabulary, the model's best guess where it was not the
    first, and the perplexity over them all (--no-chat for a text as it is, without the chat template)."""
    import mlxinfer

    m, tok = load_model(options["model"], options["compute_dtype"])
    reading = mlxinfer.prompt_logprobs(m, tok, options["prompt"], top=top, **chat_kwargs(options))
    if other_rank():
        return
    if options["json_out"]:
        print_json(reading.to_dict())
    else:
        render(reading)


def render(reading) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console = stdout_console()
    console.print(
        f"[bold]{reading.model}[/bold]  prompt: {counted(len(reading.tokens), 'token')}, every position's "
        f"scores from {reading.definition}",
        highlight=False,
    )
    t = Table()
    for name in ("#", "token", "id", "p", "bits", "rank", "the model's guess"):
        t.add_column(name, justify="left" if name in ("token", "the model's guess") else "right")
    for x in reading.tokens:
        if x.logprob is None:
            t.add_row(str(x.position), repr(x.text), str(x.id), "", "", "", "(first: nothing before it)")
            continue
        guesses = x.alternatives if x.rank != 1 else x.alternatives[1:]
        shown = "  ".join(f"{a.text!r} {_p(math.exp(a.logprob))}" for a in guesses)
        bits = -x.logprob / math.log(2)
        t.add_row(str(x.position), repr(x.text), str(x.id), _p(x.prob), f"{bits:.1f}", f"{x.rank:,}", shown)
    console.print(t)
    if reading.perplexity is None:
        console.print("one token: nothing before it, so nothing to score", highlight=False)
        return
    n = reading.scored
    console.print(
        f"perplexity {reading.perplexity:.2f} over the {counted(n, 'token')} after the first "
        f"(mean {-reading.logprob / n / math.log(2):.2f} bits a token); the model's first guess at "
        f"{reading.first_guesses:,} of {n:,}",
        highlight=False,
    )


def _p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"
