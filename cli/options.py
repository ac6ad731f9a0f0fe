"""Every option more than one command takes, declared once, with its library parameter's name.

A command lists the groups it takes (`@takes("model", "prompt", "chat", "sampling")`) and receives them as
keyword arguments; `settings` and `chat_kwargs` turn them into the library's parameters, so a command forwards
them in one line. Defaults come from mlxinfer.defaults; flags for error messages come from here too
(this module adds them to cli/flags.py's FLAGS).
"""

from __future__ import annotations

import functools
import inspect
import os
import stat
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, get_type_hints

import typer

from mlxinfer_cli import flags
from mlxinfer import GRID_FIELDS, SamplerSettings, defaults

MODEL_HELP = (
    "Model: a local directory (config.json + safetensors), a .gguf file, a Hugging Face repo id, "
    "or nothing for the embedded SmolLM2-135M-Instruct."
)
COMPUTE_HELP = (
    "quantized (quantized weights stay packed; float32 arithmetic through the batch-invariant CPU kernel), "
    "int8 (quantized's weights, each matmul's input rounded to 8 bits per group and multiplied as integers, "
    "llama.cpp's arithmetic: faster on a CPU, still batch-invariant, never picked by auto), "
    "float32 (dequantize once; every matmul through BLAS), bfloat16 (the weights as stored, MLX's own kernels: "
    "bit-exact with mlx-lm), or auto (quantized on a CPU when the kernel is built and takes the weights; else "
    "float32 with a fast BLAS when it fits in a third of RAM; else as stored)."
)


@dataclass(frozen=True)
class Opt:
    param: str  # the keyword the command receives (the library's parameter name where there is one)
    annotation: Any
    option: Any  # typer.Option(...)

    @property
    def flag(self) -> str:
        return self.option.param_decls[0].split("/")[0]


_Str = Optional[str]
_EXAMPLES = {"top_p": "0.8,0.95", "top_k": "0,20", "min_p": "0,0.05"}  # grid values a --help shows
_TABLE = {  # group: (parameter, type, default, flags, help); a default of None means "not set"
    "model": [
        ("model", _Str, None, "--model -m", MODEL_HELP),
        ("compute_dtype", str, "auto", "--compute-dtype", COMPUTE_HELP),
    ],
    "prompt": [
        (
            "prompt",
            _Str,
            None,
            "--prompt -p",
            "The text the model reads; - reads it from standard input (read too where none is given and text is "
            "piped in).",
        ),
        ("prompt_file", _Str, None, "--prompt-file -f", "Read the prompt from this UTF-8 file (or pipe) instead."),
        (
            "messages",
            _Str,
            None,
            "--messages",
            'Read the prompt as a conversation: a JSON file of chat messages (OpenAI\'s [{"role", "content"}]) '
            "or a file chat's /save wrote; the reply is the next assistant turn.",
        ),
    ],
    "chat": [
        (
            "system",
            _Str,
            None,
            "--system",
            "A system message for the chat template ('' gives an empty one, in place of the template's default).",
        ),
        ("chat", bool, True, "--chat/--no-chat", "Wrap the prompt in the model's chat template."),
        ("thinking", bool, False, "--thinking/--no-thinking", "Qwen3's thinking switch (the lessons use it off)."),
        (
            "raw_special_tokens",
            bool,
            False,
            "--raw-special-tokens",
            "Read special tokens' names in --prompt/--system (e.g. <|im_end|>) as control tokens; "
            "by default they are plain text, so only the chat template emits control tokens.",
        ),
    ],
    "schema": [
        (
            "json_schema",
            _Str,
            None,
            "--json-schema",
            "Constrain the output (every completion) to this JSON Schema (a file or inline JSON; top level an object).",
        ),
        (
            "tool",
            _Str,
            None,
            "--tool",
            "Write the input of this tool (Anthropic format: name, description, strict, input_schema; "
            "a file or inline JSON) as compact JSON. Without --system, the system message names the tool.",
        ),
    ],
    "seeds": [
        ("seeds", _Str, None, "--seeds", "Seeds: N runs 0..N-1, A:B runs A..B-1."),
        ("seed_range", _Str, None, "--seed-range", None),  # the old name of --seeds A:B, hidden
        (
            "batch_size",
            int,
            defaults.BATCH_SIZE,
            "--batch-size",
            "Seeds decoded together in one forward pass; 1 runs them one at a time.",
        ),
        (
            "shard_model",
            bool,
            False,
            "--shard-model",
            "Under mlx.launch: split the model across the ranks (for a model too big for one) and run "
            "every seed on all of them, instead of sharing the seeds out.",
        ),
    ],
    "stop": [
        (
            "stop",
            Optional[List[str]],
            None,
            "--stop",
            "End the text before this string (repeat the option for more); finish_reason is then 'stop'.",
        )
    ],
    "grouping": [
        (
            "group",
            str,
            defaults.ANSWER_GROUP,
            "--group",
            "Which completions count as one answer: first-word (case and punctuation folded: 'Basil.' is "
            "'basil'), text (the whole text) or first-token.",
        )
    ],
    "walk": [
        (
            "min_mass",
            float,
            defaults.EXACT_MIN_MASS,
            "--min-mass",
            "Walk the answers until this much of each setting's probability is resolved (1: to the end).",
        ),
        (
            "max_nodes",
            int,
            defaults.EXACT_MAX_NODES,
            "--max-nodes",
            "Expand at most this many token paths (each keeps its last token's keys and values).",
        ),
        ("max_seconds", Optional[float], None, "--max-seconds", "Stop the walk after this many seconds."),
    ],
    "exact": [
        (
            "exact",
            bool,
            False,
            "--exact",
            "Also compute each answer's exact probability (mlxinfer answers) and test the tally against it.",
        )
    ],
    "json": [("json_out", bool, False, "--json", "Print the result as JSON instead of a table.")],
}
# The sampler's settings come from their one declaration (mlxinfer.SamplerSettings.options()); unset (None),
# the model's generation_config.json fills them. `grid`: sweep's value lists, one per setting it can cross.
_SAMPLER = [o for o in SamplerSettings.options() if o.flags]
for _group in ("sampling", "penalties"):
    _TABLE[_group] = [(o.name, Optional[o.kind], None, o.flags, o.help) for o in _SAMPLER if o.group == _group]
GRID_FLAGS = {o.name: "--temps -t" if o.name == "temperature" else o.flags for o in _SAMPLER if o.grid}
_TABLE["grid"] = [
    (
        f"{name}_values",
        Optional[List[str]],
        ["1.0"] if name == "temperature" else None,
        GRID_FLAGS[name],
        "A list of temperatures to cross with the rest: '0.5,1,1.5' or the option repeated."
        if name == "temperature"
        else f"{name.replace('_', '-')} values to cross with the rest, e.g. '{_EXAMPLES.get(name, '0.5,1')}'.",
    )
    for name in GRID_FIELDS
]
GROUPS: dict[str, list[Opt]] = {
    group: [
        Opt(param, kind, typer.Option(default, *flags.split(), help=help, hidden=help is None))
        for param, kind, default, flags, help in rows
    ]
    for group, rows in _TABLE.items()
}
SAMPLING = [o.param for o in GROUPS["sampling"] + GROUPS["penalties"]]
CHAT = [o.param for o in GROUPS["chat"]]
flags.FLAGS.update({o.param: o.flag for group in GROUPS.values() for o in group})


def max_tokens_option(default: int, help: str) -> Any:
    return typer.Option(default, "--max-tokens", "-n", help=help)  # -n: llama.cpp's


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
            if "prompt" in groups:  # -p TEXT, -p -, --prompt-file PATH or --messages PATH: the command sees
                # the text, or the messages
                given, path, messages = kwargs["prompt"], kwargs.pop("prompt_file"), kwargs.pop("messages")
                if messages is not None:
                    kwargs["prompt"] = conversation(messages, given, path, kwargs.get("chat", True))
                    return fn(**kwargs)
                given = "-" if given is None and path is None and piped_stdin() else given
                kwargs["prompt"] = prompt_text(given, path)
                name_prompt_source(given, path)
            return fn(**kwargs)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


def piped_stdin() -> bool:
    """Whether standard input is a pipe or a file (`echo TEXT | mlxinfer topk`, `< prompt.txt`): a
    command given no prompt then reads it, as -p - would. A terminal, /dev/null or none: not."""
    if launched():  # mlx.launch gives each rank a pipe it never closes: read, it never ends
        return False
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # no descriptor (an embedding, a test runner's stream)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def launched() -> bool:
    """Whether this process is a rank that mlx.launch started (it sets MLX_RANK)."""
    return os.environ.get("MLX_RANK") is not None


def name_prompt_source(prompt: Optional[str], prompt_file: Optional[str]) -> None:
    """An error about the prompt names where it came from: --prompt-file PATH or standard input."""
    if prompt_file is not None or prompt == "-":
        flags.use(prompt=f"--prompt-file {prompt_file}" if prompt_file is not None else "standard input (-p -)")


def conversation(messages: str, prompt: Optional[str], prompt_file: Optional[str], chat: bool) -> list[dict]:
    """--messages PATH's conversation (mlxinfer.read_messages), given alone and with the chat template."""
    import mlxinfer

    if prompt is not None or prompt_file is not None:
        raise mlxinfer.MlxinferError("give the prompt with -p, --prompt-file or --messages: one of them")
    if not chat:
        raise mlxinfer.MlxinferError("--messages is a conversation, read through the chat template; drop --no-chat")
    flags.use(prompt=f"--messages {messages}")  # an error about a message names the file
    return mlxinfer.read_messages(messages)


def prompt_text(prompt: Optional[str], prompt_file: Optional[str]) -> str:
    """The prompt -p TEXT gives, or standard input's for -p -, or the file's for --prompt-file, checked."""
    import mlxinfer

    if prompt is not None and prompt_file is not None:
        raise mlxinfer.MlxinferError(
            "give the prompt with -p TEXT (-p - reads standard input) or --prompt-file PATH, not both"
        )
    if prompt_file == "":  # was: ". is a directory" (the empty path's reading)
        raise mlxinfer.MlxinferError("--prompt-file is empty; give the path of a UTF-8 text file")
    if prompt == "-" and prompt_file is None and launched():  # was: every rank waited for ever
        raise mlxinfer.MlxinferError(
            "-p - reads standard input, which mlx.launch keeps open and never ends for its ranks; "
            "give the prompt with --prompt-file PATH or -p TEXT"
        )
    if prompt_file is not None or prompt == "-":
        return mlxinfer.read_prompt(prompt_file if prompt_file is not None else "-")
    if prompt is None:  # under mlx.launch standard input is not one of the ways
        stdin = "" if launched() else ", -p - (standard input)"
        raise mlxinfer.MlxinferError(f"give a prompt: -p TEXT{stdin} or --prompt-file PATH")
    if not prompt.strip():  # as an empty file or standard input is: the one rule, before any model loads
        raise mlxinfer.MlxinferError("--prompt is empty; give the text to read")
    return prompt


def model_or_first(model: Optional[str], given: list, usage: str) -> tuple[str, list]:
    """The model a command reads, as its first positional argument or as --model/-m (then every positional
    is one of the rest): (model, the other positionals). `usage`: the command's line, for the error."""
    from mlxinfer import MlxinferError

    given = [g for g in given if g is not None]
    if model is None:
        if not given:
            raise MlxinferError(f"give the model: {usage}")
        return given[0], given[1:]
    flags.use(source="--model")
    return model, given


def settings(options: dict) -> dict:
    """The sampling options the user set (None: not set), checked before any model loads."""
    import mlxinfer

    return mlxinfer.check_settings({k: options[k] for k in SAMPLING if k in options})


def parse_numbers(values: list[str], option: str, kind=float) -> tuple:
    """'0.5,1.0 1.5' or a repeated option -> (0.5, 1.0, 1.5); kind=int for whole numbers."""
    from mlxinfer import MlxinferError, check_listed_once

    out = []
    for value in values:
        if "," in value and any(not chunk.strip() for chunk in value.split(",")):
            raise MlxinferError(f"{option} '{value}' has an empty item between commas; drop the extra comma")
        for part in value.replace(",", " ").split():
            try:
                out.append(kind(part))
            except ValueError:
                example = "numbers like 0.5,1.0,1.5" if kind is float else "whole numbers like 32,64,128"
                raise MlxinferError(f"{option} takes {example}; got '{part}'") from None
    check_listed_once(out, option)  # before the model loads
    return tuple(out)


def grid(options: dict) -> list[dict]:
    """sweep's value lists (--temps, --top-p, ...) as the grid of settings, each cell checked."""
    import mlxinfer

    kinds = {o.name: o.kind for o in _SAMPLER}
    axes = {
        name: parse_numbers(values, GRID_FLAGS[name].split()[0], kinds[name])
        for name in GRID_FIELDS
        if (values := options[f"{name}_values"]) is not None
    }
    cells = mlxinfer.settings_grid(axes.pop("temperature", None), **axes)
    for cell in cells:
        mlxinfer.check_settings(cell)  # bad values fail before the model loads
    return cells


def stop(options: dict):
    """--stop, checked before any model loads: a tuple of strings, or None."""
    import mlxinfer

    return mlxinfer.check_stop(options["stop"]) or None


def exact_kwargs(options: dict) -> dict:
    """--group, --exact, --min-mass and --max-nodes (those the command takes) as the library's keywords,
    checked before any model loads."""
    import mlxinfer

    given = {k: options[k] for k in ("group", "exact", "min_mass", "max_nodes", "max_seconds") if k in options}
    if given.get("exact") is False:  # sample and sweep walk only with --exact: a bound without it did nothing
        for o in GROUPS["walk"]:
            if given.get(o.param, o.option.default) != o.option.default:
                why = "bounds the exact walk, which runs with --exact: add it"
                raise mlxinfer.MlxinferError(f"{o.flag} {why}", o.param)
    mlxinfer.check_walk(given.get("min_mass", 1.0), given.get("max_nodes", 1), given["group"], given.get("max_seconds"))
    return given


def chat_kwargs(options: dict) -> dict:
    """system, chat, thinking and raw_special_tokens, as the library's keywords."""
    return {k: options[k] for k in CHAT}


def seeds(options: dict):
    """--seeds N or A:B (or the old --seed-range A:B), checked: the seed list."""
    import mlxinfer

    given = [v for v in (options["seeds"], options["seed_range"]) if v is not None]
    if len(given) > 1:
        raise mlxinfer.MlxinferError("--seeds and --seed-range both given; pass one (--seeds A:B is the range)")
    if not given:
        raise mlxinfer.MlxinferError("give --seeds N (seeds 0..N-1) or --seeds A:B (seeds A..B-1)")
    old = options["seed_range"] is not None
    if old:
        flags.use(seeds="--seed-range")
    seed_list = mlxinfer.seed_list(given[0])
    if old:
        flags.renamed("--seed-range", "--seeds A:B")
    return seed_list
