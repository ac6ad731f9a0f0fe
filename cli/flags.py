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
