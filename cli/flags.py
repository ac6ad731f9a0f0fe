"""The CLI's flags and the library's parameter names, in one place.

The library's errors name its parameters (`max_tokens must be at least 1, got 0`) and list them
in `MlxinferError.params`; `error_line` puts the flag a terminal user typed in their place
(`--max-tokens must be at least 1, got 0`). A command whose flag differs for one parameter
(count's MODEL argument) says so with `use(...)` before it calls the library. An old spelling still
accepted for a release (--seed-range, topk's -k, bench's bare GB/s number) goes through `renamed(...)`:
its errors name the spelling typed (`use`), and `renamed` queues one line for stderr naming the new one.
"""

from __future__ import annotations

import re

PLAIN = (  # parameters whose flag is their name: max_tokens -> --max-tokens
    "max_tokens seed out resume logprobs explain_mask context ranks answer_tokens flops bandwidth prompt_tokens "
    "gen_tokens repeats bits group_size head_bits embed_bits dtype force window text host api_key cors port "
    "max_rows max_queue max_body_bytes default_max_tokens log_level"
).split()
FLAGS = {  # cli/options.py adds the flags of the options it declares
    "source": "--model",
    "chat=False": "--no-chat",
    "raw_special_tokens=True": "--raw-special-tokens",
    "temperatures": "--temps",
    "k": "--rows",
    "explain_sampler": "--explain",
    "prompts": "--prompt",
    "prompts_file": "--prompts",
    "bandwidth_gb_s": "--bandwidth",
    "max_shard_bytes": "--max-shard-size",
    "candidates": "CANDIDATES",
    "model_name": "--served-model-name",
    "prompt_cache_bytes": "--prompt-cache-mb",
    **{name: "--" + name.replace("_", "-") for name in PLAIN},
}
_overrides: dict[str, str] = {}
_notes: list[str] = []


def use(**flags: str) -> None:
    """This command names these parameters differently, e.g. use(source="MODEL")."""
    _overrides.update(flags)


def renamed(old: str, new: str, going: str = "") -> None:
    """The user typed `old`, the deprecated spelling of `new` (`going`: what goes, if not `old` itself).
    cli/app.py prints the line on stderr once the command succeeds, so bad input stays one error line."""
    _notes.append(f"note: {old} is now {new}; {going or old} will go in a later release")


def flag(param: str) -> str:
    return _overrides.get(param) or FLAGS.get(param, param)


def named(text: str, *params: str) -> str:
    """`text` with the first mention of each parameter replaced by its flag, on one line. A word inside a
    path the message quotes (`/data/out`, `./resume`) is the user's, not a mention."""
    for param in params:
        for match in re.finditer(rf"(?<![\w-]){re.escape(param)}(?![\w-])", text):
            start = max(text.rfind(" ", 0, match.start()), text.rfind("\n", 0, match.start())) + 1
            token = text[start:].split(maxsplit=1)[0]
            if not ("/" in token or "\\" in token or token.startswith(("~", "."))):
                text = text[: match.start()] + flag(param) + text[match.end() :]
                break
    return " ".join(text.split())


def error_line(e) -> str:
    """An MlxinferError's message in the CLI's words."""
    return named(str(e), *getattr(e, "params", ()))


# Other tools' flags that no command here has: (the tool, our flag that does the same or None where none is
# needed, what to say). A usage error that holds one in an option's place says so, where Click guessed a near
# spelling (--n-predict: "--no-chat?") or misread one (-ngl: -n gl).
_LAYERS = "MLX runs every layer on its device, the GPU on a Mac"
_CONTEXT = "the model's own context bounds the prompt and the answer"
_GRAMMAR = "--json-schema FILE or --tool FILE (JSON Schema; GBNF is not read)"
_SEEDS = "--seeds: N runs seeds 0..N-1, A:B runs A..B-1 (seed 3 alone: --seeds 3:4)"
_THREADS = "the kernels use every core this process may, MLXINFER_QMM_THREADS=N fewer"
_CHAT = "a conversation is a command of its own: mlxinfer chat"
PEER_FLAGS = {
    "--n-predict": ("llama.cpp", "--max-tokens", "--max-tokens (-n)"),
    "--predict": ("llama.cpp", "--max-tokens", "--max-tokens (-n)"),
    "-r": ("llama.cpp", "--stop", "--stop TEXT"),
    "--reverse-prompt": ("llama.cpp", "--stop", "--stop TEXT"),
    "--repeat-penalty": ("llama.cpp", "--repetition-penalty", "--repetition-penalty"),
    "-ngl": ("llama.cpp", None, _LAYERS),
    "--n-gpu-layers": ("llama.cpp", None, _LAYERS),
    "--gpu-layers": ("llama.cpp", None, _LAYERS),
    "--threads": ("llama.cpp", None, _THREADS),
    "-c": ("llama.cpp", None, _CONTEXT),
    "--ctx-size": ("llama.cpp", None, _CONTEXT),
    "-np": ("llama-server", "--max-rows", "--max-rows"),
    "--parallel": ("llama-server", "--max-rows", "--max-rows"),
    "--alias": ("llama-server", "--served-model-name", "--served-model-name"),
    "--grammar": ("llama.cpp", "--json-schema", _GRAMMAR),
    "--grammar-file": ("llama.cpp", "--json-schema", _GRAMMAR),
    "--max-kv-size": ("mlx-lm", None, "the cache holds the whole context"),
    "--n_predict": ("llama.cpp", "--max-tokens", "--max-tokens (-n)"),
    "-s": ("llama.cpp", "--seed", "--seed N"),
    "-t": ("llama.cpp", None, _THREADS),
    "--system-prompt": ("llama.cpp", "--system", "--system TEXT"),
    "-sys": ("llama.cpp", "--system", "--system TEXT"),
    "-cnv": ("llama.cpp", None, _CHAT),
    "--conversation": ("llama.cpp", None, _CHAT),
    "--jinja": ("llama.cpp", None, "the model's chat template always renders (in a sandbox); --no-chat skips it"),
    "--chat-template": ("llama.cpp", None, "the chat template is the model's own; --no-chat skips it"),
    "--ignore-chat-template": ("mlx-lm", "--no-chat", "--no-chat"),
    "--color": ("llama.cpp", None, "tables are coloured where the output is a terminal"),
    "--logit-bias": ("llama.cpp", None, "logit_bias is a field of the server's requests (mlxinfer serve)"),
    "--verbose": (
        "mlx-lm",
        None,
        "the speed and the finish reason go to stderr already; --debug (before the command) shows an error's detail",
    ),
    "--seed": ("generate", "--seeds", _SEEDS),
    # several letters after one dash: Click reads -fa as -f a (a prompt file named "a", read if it exists) and
    # -no-cnv as -n o-cnv, so these are also looked for before the command parses (misread_flag)
    "-fa": ("llama.cpp", None, "MLX's attention is its own (flash attention is not a switch here)"),
    "-no-cnv": ("llama.cpp", None, "generate answers once; a conversation is mlxinfer chat"),
    "-st": ("llama.cpp", None, "generate answers once; a conversation is mlxinfer chat"),
    "-mli": ("llama.cpp", None, "chat takes a line a message; a longer one goes in --messages FILE"),
    "-nkvo": ("llama.cpp", None, _LAYERS),
    "-cmoe": ("llama.cpp", None, _LAYERS),
    "-ncmoe": ("llama.cpp", None, _LAYERS),
    "-ot": ("llama.cpp", None, _LAYERS),
    "-ctk": ("llama.cpp", None, "the KV cache is kept in the compute dtype (--compute-dtype)"),
    "-ctv": ("llama.cpp", None, "the KV cache is kept in the compute dtype (--compute-dtype)"),
    "-tb": ("llama.cpp", None, _THREADS),
    "-ns": ("llama.cpp", "--seeds", "--seeds N for N seeded draws in one batch (sample)"),
    "-hf": ("llama.cpp", "--model", "--model REPO (a Hugging Face repo id)"),
    "-md": ("llama.cpp", None, "there is no draft model (speculative decoding)"),
    "-sp": ("llama.cpp", None, "the text is the tokenizer's decoding of the reply"),
    "-ub": ("llama.cpp", None, "the engine chooses its batches"),
}
_SEVERAL_LETTERS = re.compile(r"-[a-z]{2,}(-[a-z]+)*")
_GGUF_TYPE = re.compile(r"(?i)^(I?Q\d(_[0-9KSMLXN]+)*|F16|BF16|F32)$")


def misread_flag(args: list[str], params) -> str | None:
    """What to say where another tool's flag of several letters after one dash (-fa, -no-cnv) holds an option's
    place among a command's arguments: Click would read it as short flags run together (was: `generate -fa`
    read a file named "a" as the prompt); else None."""
    return _peer_flag(args, params, lambda name: _SEVERAL_LETTERS.fullmatch(name) is not None, always=True)


def _peer_flag(args: list[str], params, wanted=lambda name: True, always: bool = False) -> str | None:
    """The line for the first of PEER_FLAGS (those `wanted`) in an option's place in `args` that the command lacks:
    said where the command has the flag to use instead, or needs none (always: said in any case)."""
    import click

    ours = {opt for p in params for opt in p.opts + p.secondary_opts}
    takes_value = {
        opt for p in params if isinstance(p, click.Option) and not p.is_flag and not p.count for opt in p.opts
    }
    value_next = False
    for arg in args:
        if value_next:  # the value of an option (-p "-c", --stop --): text, not a flag
            value_next = False
            continue
        if arg == "--":  # the rest are arguments, never flags
            return None
        name = arg.split("=", 1)[0]
        if name in takes_value and "=" not in arg:
            value_next = True
        elif name in PEER_FLAGS and name not in ours and wanted(name):
            tool, instead, say = PEER_FLAGS[name]
            if instead is None:
                return f"{name} is {tool}'s flag, and mlxinfer has no such setting: {say}; drop it"
            if instead in ours:
                return f"{name} is {tool}'s flag; here use {say}"
            return f"{name} is {tool}'s flag, and this command has no such setting; drop it" if always else None
    return None


def peer_hint(args: list[str], message: str, ctx) -> str | None:
    """The usage error's line when an option's place in the arguments holds another tool's flag that this
    command lacks (said only where the command has the flag to use instead, or needs none), or a GGUF type
    is given to quantize, or a bare - stands for standard input; else None (Click's own line)."""
    params = ctx.command.params if ctx is not None else []
    ours = {opt for p in params for opt in p.opts + p.secondary_opts}
    said = _peer_flag(args, params)
    if said is not None:
        return said
    extra = re.search(r"unexpected extra arguments? \(([^) ]+)", message)
    if extra and extra.group(1) == "-":
        return "a prompt from standard input is -p - (or a pipe with no -p), not a bare -"
    if extra and _GGUF_TYPE.match(extra.group(1)):
        return (
            f"{extra.group(1)} is a GGUF type (llama-quantize's); mlxinfer quantize writes MLX's affine"
            " weights (--bits 4 or 8), and a GGUF of any type loads with --model"
        )
    if extra and "--prompt" in ours and not any(a in ("-p", "--prompt") or a.startswith("--prompt=") for a in args):
        return f"{message}; the prompt is an option here: -p TEXT"  # was: the bare `generate "Put basil ..."`
    several = re.search(r"'([^']*,[^']*)' is not a valid float", message)
    if several and "--temps" in ours:
        return f"{message.rstrip('.')}; several temperatures go to --temps {several.group(1)}"
    return None
