"""`mlxinfer count`: the lesson's parameter table, bytes and operations per token.

All the arithmetic lives in mlxinfer.counting; the text is cli/count_text.py's.
Nothing here (or there) imports mlx, so the command starts in a fraction of a second.
"""

from __future__ import annotations

from typing import Optional

import typer

from mlxinfer_cli import flags
from mlxinfer_cli.common import MODEL_HELP, JsonOption, print_json
from mlxinfer_cli.count_text import render

RATE_HELP = "Prefixes are decimal (k M G T P = 10^3 .. 10^15), Ki Mi Gi Ti binary; a plain number (1e12) is per second."


def count_command(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP + " A config .json file works too."),
    model_option: Optional[str] = typer.Option(None, "--model", "-m", help="Same as MODEL."),
    context: Optional[int] = typer.Option(
        None, "--context", help="Tokens the new token attends to (the prompt so far): the attention work there."
    ),
    answer_tokens: Optional[int] = typer.Option(
        None, "--answer-tokens", help="Whole answer of this many tokens after a --context-token prompt."
    ),
    flops: Optional[str] = typer.Option(
        None, "--flops", help=f"Arithmetic rate, operations per second, e.g. 989T (H100). {RATE_HELP}"
    ),
    bandwidth: Optional[str] = typer.Option(
        None, "--bandwidth", help=f"Memory bandwidth, bytes per second: 3.35TB/s (H100), 400GB/s. {RATE_HELP}"
    ),
    ranks: Optional[int] = typer.Option(
        None,
        "--ranks",
        help="Memory per rank when the model is split across N ranks (mlx.launch -n N): weights, and the "
        "KV cache at --context tokens (default: the model's whole context).",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Count parameters, bytes and operations per token from config.json; check them against the files.

    Examples (the lesson's numbers; before buying a second Mac):
      mlxinfer count Qwen/Qwen3-0.6B --context 12060 --answer-tokens 300 --flops 989T --bandwidth 3.35TB/s
      mlxinfer count MODEL --ranks 2 --context 32768
    """
    import mlxinfer
    from mlxinfer import MlxinferError

    if model is not None and model_option is not None and model != model_option:
        raise MlxinferError(f"two models given ({model} and --model {model_option}); pass one")
    if model is not None:
        flags.use(source="MODEL")
    report = mlxinfer.count(
        model if model is not None else model_option,
        context=context,
        answer_tokens=answer_tokens,
        flops=flops,
        bandwidth=bandwidth,
        ranks=ranks,
    )
    if as_json:
        print_json(report.to_dict())
    else:
        typer.echo(render(report))
