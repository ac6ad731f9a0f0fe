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

FLAGS = {  # cli/options.py adds the flags of the options it declares
    "source": "--model",
    "chat=False": "--no-chat",
    "raw_special_tokens=True": "--raw-special-tokens",
    "temperatures": "--temps",
    "k": "--rows",
    "explain_sampler": "--explain",
    "max_tokens": "--max-tokens",
    "seed": "--seed",
    "prompts": "--prompt",
    "prompts_file": "--prompts",
    "out": "--out",
    "resume": "--resume",
    "logprobs": "--logprobs",
    "explain_mask": "--explain-mask",
    "context": "--context",
    "ranks": "--ranks",
    "answer_tokens": "--answer-tokens",
    "flops": "--flops",
    "bandwidth": "--bandwidth",
    "bandwidth_gb_s": "--bandwidth",
    "prompt_tokens": "--prompt-tokens",
    "gen_tokens": "--gen-tokens",
    "repeats": "--repeats",
    "bits": "--bits",
    "group_size": "--group-size",
    "head_bits": "--head-bits",
    "embed_bits": "--embed-bits",
    "dtype": "--dtype",
    "force": "--force",
    "max_shard_bytes": "--max-shard-size",
    "window": "--window",
    "text": "--text",
    "candidates": "CANDIDATES",
    "host": "--host",
    "api_key": "--api-key",
    "cors": "--cors",
    "model_name": "--served-model-name",
    "port": "--port",
    "max_rows": "--max-rows",
    "max_queue": "--max-queue",
    "max_body_bytes": "--max-body-bytes",
    "default_max_tokens": "--default-max-tokens",
    "prompt_cache_bytes": "--prompt-cache-mb",
    "log_level": "--log-level",
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
    """`text` with the first mention of each parameter replaced by its flag, on one line."""
    for param in params:
        pattern = re.compile(rf"(?<![\w-]){re.escape(param)}(?![\w-])")
        text = pattern.sub(flag(param).replace("\\", r"\\"), text, count=1)
    return " ".join(text.split())


def error_line(e) -> str:
    """An MlxinferError's message in the CLI's words."""
    return named(str(e), *getattr(e, "params", ()))


# Other tools' flags that no command here has, and what to type instead: a usage error that holds one
# says so, where Click would guess at a near spelling (--n-predict: "--no-chat?") or misread (-ngl: -n gl).
_NO_LAYERS = "nothing: MLX runs every layer on its device, the GPU on a Mac"
PEER_FLAGS = {
    "--n-predict": ("llama.cpp", "--max-tokens (-n)"),
    "--predict": ("llama.cpp", "--max-tokens (-n)"),
    "-r": ("llama.cpp", "--stop TEXT"),
    "--reverse-prompt": ("llama.cpp", "--stop TEXT"),
    "--repeat-penalty": ("llama.cpp", "--repetition-penalty"),
    "-ngl": ("llama.cpp", _NO_LAYERS),
    "--n-gpu-layers": ("llama.cpp", _NO_LAYERS),
    "--gpu-layers": ("llama.cpp", _NO_LAYERS),
    "--threads": ("llama.cpp", "nothing: the kernels use every core this process may, MLXINFER_QMM_THREADS=N fewer"),
    "-c": ("llama.cpp", "nothing: the model's own context bounds the prompt and the answer"),
    "--ctx-size": ("llama.cpp", "nothing: the model's own context bounds the prompt and the answer"),
    "-np": ("llama-server", "serve --max-rows"),
    "--parallel": ("llama-server", "serve --max-rows"),
    "--alias": ("llama-server", "serve --served-model-name"),
    "--grammar": ("llama.cpp", "--json-schema FILE or --tool FILE (JSON Schema; GBNF is not read)"),
    "--grammar-file": ("llama.cpp", "--json-schema FILE or --tool FILE (JSON Schema; GBNF is not read)"),
    "--max-kv-size": ("mlx-lm", "nothing: the cache holds the whole context"),
    "--seed": ("generate", "--seeds: N runs seeds 0..N-1, A:B runs A..B-1 (seed 3 alone: --seeds 3:4)"),
}
_GGUF_TYPE = re.compile(r"(?i)^(I?Q\d(_[0-9KSMLXN]+)*|F16|BF16|F32)$")


def peer_hint(args: list[str], message: str, ctx) -> str | None:
    """The usage error's line when the arguments hold another tool's flag (or a GGUF type given to
    quantize, or a bare - for standard input), else None."""
    ours = {opt for p in (ctx.command.params if ctx is not None else []) for opt in p.opts + p.secondary_opts}
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in PEER_FLAGS and name not in ours:
            tool, instead = PEER_FLAGS[name]
            if instead.startswith("nothing: "):
                return f"{name} is {tool}'s flag, and mlxinfer has no such setting: {instead[9:]}; drop it"
            return f"{name} is {tool}'s flag; here use {instead}"
    extra = re.search(r"unexpected extra arguments? \(([^) ]+)", message)
    if extra and extra.group(1) == "-":
        return "a prompt from standard input is -p - (or a pipe with no -p), not a bare -"
    if extra and _GGUF_TYPE.match(extra.group(1)):
        return (
            f"{extra.group(1)} is a GGUF type (llama-quantize's); mlxinfer quantize writes MLX's affine"
            " weights (--bits 4 or 8), and a GGUF of any type loads with --model"
        )
    return None
