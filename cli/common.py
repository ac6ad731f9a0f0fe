"""What every command shares: the model and sampling options, JSON output, progress bars."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import typer

MODEL_HELP = (
    "Model: a local directory (config.json + safetensors), a .gguf file, a Hugging Face repo id, "
    "or nothing for the embedded SmolLM2-135M-Instruct."
)
ModelOption = typer.Option(None, "--model", "-m", help=MODEL_HELP)
JsonOption = typer.Option(False, "--json", help="Print the result as JSON instead of a table.")
ComputeOption = typer.Option(
    "auto",
    "--compute-dtype",
    help="float32 (dequantize once; every matmul through BLAS), bfloat16 (weights as stored), "
    "or auto (float32 on a CPU with a fast BLAS when it fits in a third of RAM).",
)
PromptOption = typer.Option(..., "--prompt", "-p", help="The text the model reads.")
SystemOption = typer.Option(None, "--system", help="A system message for the chat template.")
ChatOption = typer.Option(True, "--chat/--no-chat", help="Wrap the prompt in the model's chat template.")
RawSpecialOption = typer.Option(
    False,
    "--raw-special-tokens",
    help="Read special tokens' names in --prompt/--system (e.g. <|im_end|>) as control tokens; "
    "by default they are plain text, so only the chat template emits control tokens.",
)
ThinkingOption = typer.Option(
    False, "--thinking/--no-thinking", help="Qwen3's thinking switch (the lessons use it off)."
)


def print_json(data: Any) -> None:
    """Strict JSON: a number that is not finite (a masked token's log-probability, -inf) is null, and
    json.dumps refuses anything else that JSON cannot hold rather than print a bare NaN."""
    sys.stdout.write(json.dumps(_finite(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def _finite(obj: Any):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return _finite(obj.to_dict())
    return obj


def parse_numbers(values: list[str], option: str, kind=float) -> tuple:
    """'0.5,1.0 1.5' or a repeated option -> (0.5, 1.0, 1.5); kind=int for whole numbers."""
    from mlxinfer.errors import MlxinferError

    out = []
    for value in values:
        for part in value.replace(",", " ").split():
            try:
                out.append(kind(part))
            except ValueError:
                example = "numbers like 0.5,1.0,1.5" if kind is float else "whole numbers like 32,64,128"
                raise MlxinferError(f"{option} takes {example}; got '{part}'") from None
    return tuple(out)


# Sampling options: None means "not set", so the model's generation_config.json can fill it.
TempOption = typer.Option(None, "--temp", "--temperature", help="Divide scores by T before softmax; 0 = greedy.")
TopPOption = typer.Option(None, "--top-p", help="Keep the smallest set of top tokens holding at least p (1 = off).")
TopKOption = typer.Option(None, "--top-k", help="Keep the k most likely tokens (0 = off).")
MinPOption = typer.Option(None, "--min-p", help="Keep tokens with at least this fraction of the top probability.")
RepetitionOption = typer.Option(
    None, "--repetition-penalty", help="Divide seen tokens' positive scores by this (1 = off)."
)
PresenceOption = typer.Option(None, "--presence-penalty", help="Subtract this from every seen token's score.")
FrequencyOption = typer.Option(None, "--frequency-penalty", help="Subtract this times a token's count so far.")
OrderOption = typer.Option(
    None, "--order", help="'lesson' (temperature, then cut) or 'mlx-lm' (cut, then temperature)."
)


def sampling(temp, top_p, top_k, min_p, repetition=None, presence=None, frequency=None, order=None) -> dict:
    """The sampling options the user set (None: not set), checked before any model loads."""
    from mlxinfer.settings import user_settings

    return user_settings(
        {
            "temperature": temp,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "repetition_penalty": repetition,
            "presence_penalty": presence,
            "frequency_penalty": frequency,
            "order": order,
        }
    )


def progress_bar(total: int, description: str, enabled: bool = True):
    """A rich progress bar on stderr, as a (done, total) callback and a context manager."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)  # not at a terminal: no bar, so an error stays the one line on stderr
    progress = Progress(console=console, transient=True, disable=not enabled or not console.is_terminal)
    task = progress.add_task(description, total=total)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


ShardModelOption = typer.Option(
    False,
    "--shard-model",
    help="Under mlx.launch: split the model across the ranks (for a model too big for one) and run "
    "every seed on all of them, instead of sharing the seeds out.",
)


def load_model(model, compute_dtype: str, shard: bool = True):
    """mlxinfer.load; under mlx.launch with several ranks (and `shard`) the model is split across them."""
    import mlxinfer
    from mlxinfer.engine.ranks import group

    ranks = group() if shard else None
    return mlxinfer.load(model, compute_dtype, group=ranks if ranks is not None and ranks.size() > 1 else None)


def sharding_line(sharding: dict | None) -> str:
    """How the model is split, in one line ('' on one process)."""
    if not sharding:
        return ""

    def span(name: str, r: dict) -> str:
        a, b = r[name]
        return f"{a}" if b - a == 1 else f"{a}-{b - 1}"

    parts = []
    for r in sharding["shares"]:
        where = (
            f"query heads {span('q_heads', r)} (KV {span('kv_heads', r)}), MLP {span('mlp_columns', r)}, "
            if "q_heads" in r
            else ""
        )
        parts.append(f"rank {r['rank']}: {where}{r['weight_bytes'] / 1e6:,.1f} MB")
    whole = sharding["one_process_weight_bytes"] / 1e6
    return f"split across {sharding['ranks']} ranks: " + "; ".join(parts) + f" (one process: {whole:,.1f} MB)"


def other_rank() -> bool:
    """True on ranks 1.. under mlx.launch: rank 0 prints for every rank, the others stay quiet."""
    from mlxinfer.engine.ranks import group

    return group().rank() > 0
