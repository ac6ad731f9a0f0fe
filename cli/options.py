"""Every option more than one command takes, declared once, with its library parameter's name.

A command lists the groups it takes (`@takes("model", "prompt", "chat", "sampling")`) and receives them as
keyword arguments; `settings` and `chat_kwargs` turn them into the library's parameters, so a command forwards
them in one line. Defaults come from mlxinfer.defaults; flags for error messages come from here too
(cli/flags.py reads FLAGS_BY_PARAM).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, get_type_hints

import typer

from mlxinfer import defaults

MODEL_HELP = (
    "Model: a local directory (config.json + safetensors), a .gguf file, a Hugging Face repo id, "
    "or nothing for the embedded SmolLM2-135M-Instruct."
)
COMPUTE_HELP = (
    "float32 (dequantize once; every matmul through BLAS), bfloat16 (weights as stored), "
    "or auto (float32 on a CPU with a fast BLAS when it fits in a third of RAM)."
)


@dataclass(frozen=True)
class Opt:
    param: str  # the keyword the command receives (the library's parameter name where there is one)
    annotation: Any
    option: Any  # typer.Option(...)

    @property
    def flag(self) -> str:
        return self.option.param_decls[0]


def _opt(param: str, annotation, default, *decls: str, **kw) -> Opt:
    return Opt(param, annotation, typer.Option(default, *decls, **kw))


GROUPS: dict[str, tuple[Opt, ...]] = {
    "model": (
        _opt("model", Optional[str], None, "--model", "-m", help=MODEL_HELP),
        _opt("compute_dtype", str, "auto", "--compute-dtype", help=COMPUTE_HELP),
    ),
    "prompt": (_opt("prompt", str, ..., "--prompt", "-p", help="The text the model reads."),),
    "chat": (
        _opt("system", Optional[str], None, "--system", help="A system message for the chat template."),
        _opt("chat", bool, True, "--chat/--no-chat", help="Wrap the prompt in the model's chat template."),
        _opt(
            "thinking",
            bool,
            False,
            "--thinking/--no-thinking",
            help="Qwen3's thinking switch (the lessons use it off).",
        ),
        _opt(
            "raw_special_tokens",
            bool,
            False,
            "--raw-special-tokens",
            help="Read special tokens' names in --prompt/--system (e.g. <|im_end|>) as control tokens; "
            "by default they are plain text, so only the chat template emits control tokens.",
        ),
    ),
    # None means "not set", so the model's generation_config.json can fill it
    "sampling": (
        _opt(
            "temperature",
            Optional[float],
            None,
            "--temp",
            "--temperature",
            help="Divide scores by T before softmax; 0 = greedy.",
        ),
        _opt(
            "top_p", Optional[float], None, "--top-p", help="Keep the smallest set of top tokens holding p (1 = off)."
        ),
        _opt("top_k", Optional[int], None, "--top-k", help="Keep the k most likely tokens (0 = off)."),
        _opt("min_p", Optional[float], None, "--min-p", help="Keep tokens with at least this share of the top p."),
        _opt(
            "order", Optional[str], None, "--order", help="'lesson' (temperature, then cut) or 'mlx-lm' (cut, then T)."
        ),
    ),
    "penalties": (
        _opt(
            "repetition_penalty",
            Optional[float],
            None,
            "--repetition-penalty",
            help="Divide seen tokens' positive scores by this (1 = off).",
        ),
        _opt("presence_penalty", Optional[float], None, "--presence-penalty", help="Subtract this from seen tokens."),
        _opt(
            "frequency_penalty", Optional[float], None, "--frequency-penalty", help="Subtract this x a token's count."
        ),
    ),
    "schema": (
        _opt(
            "json_schema",
            Optional[str],
            None,
            "--json-schema",
            help="Constrain the output (each seed's, in sample) to this JSON Schema (a file or inline JSON; "
            "top level an object).",
        ),
        _opt(
            "tool",
            Optional[str],
            None,
            "--tool",
            help="Write the input of this tool (Anthropic format: name, description, strict, input_schema; "
            "a file or inline JSON) as compact JSON. Without --system, the system message names the tool.",
        ),
    ),
    "seeds": (
        _opt("seeds", Optional[str], None, "--seeds", help="Seeds: N runs 0..N-1, A:B runs A..B-1."),
        _opt("seed_range", Optional[str], None, "--seed-range", hidden=True, help="Old name: --seeds A:B."),
        _opt(
            "batch_size",
            int,
            defaults.BATCH_SIZE,
            "--batch-size",
            help="Seeds decoded together in one forward pass; 1 runs them one at a time.",
        ),
        _opt(
            "shard_model",
            bool,
            False,
            "--shard-model",
            help="Under mlx.launch: split the model across the ranks (for a model too big for one) and run "
            "every seed on all of them, instead of sharing the seeds out.",
        ),
    ),
    "json": (_opt("json_out", bool, False, "--json", help="Print the result as JSON instead of a table."),),
}
SAMPLING = [o.param for o in GROUPS["sampling"] + GROUPS["penalties"]]
CHAT = [o.param for o in GROUPS["chat"]]
FLAGS_BY_PARAM = {o.param: o.flag.split("/")[0] for group in GROUPS.values() for o in group}


def max_tokens_option(default: int, help: str) -> Any:
    return typer.Option(default, "--max-tokens", help=help)


def takes(*groups: str) -> Callable:
    """Add these option groups to a command: it receives them as keyword arguments (**options)."""
    extra = [o for g in groups for o in GROUPS[g]]

    def wrap(fn):
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        hints = get_type_hints(fn)
        params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in own]
        params += [
            inspect.Parameter(o.param, inspect.Parameter.KEYWORD_ONLY, default=o.option, annotation=o.annotation)
            for o in extra
        ]

        @functools.wraps(fn)
        def command(**kwargs):
            return fn(**kwargs)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


def settings(options: dict) -> dict:
    """The sampling options the user set (None: not set), checked before any model loads."""
    import mlxinfer

    return mlxinfer.check_settings({k: options[k] for k in SAMPLING if k in options})


def chat_kwargs(options: dict) -> dict:
    """system, chat, thinking and raw_special_tokens, as the library's keywords."""
    return {k: options[k] for k in CHAT}


def seeds(options: dict):
    """--seeds N or A:B (or the old --seed-range A:B), checked: the seed list."""
    import mlxinfer
    from cli import flags

    given = [v for v in (options["seeds"], options["seed_range"]) if v is not None]
    if len(given) != 1:
        raise mlxinfer.MlxinferError("give --seeds N (seeds 0..N-1) or --seeds A:B (seeds A..B-1)")
    if options["seed_range"] is not None:
        flags.use(seeds="--seed-range")
    return mlxinfer.seed_list(given[0])
