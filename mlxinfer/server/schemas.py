"""The request bodies, as OpenAI defines them, with the toolkit's sampler extras (as vLLM takes them).

Strict types (pydantic's strict mode): "5" is not a number and 1.5 is not a count, so a wrong type
is a 400 naming the field rather than a guess. Fields OpenAI has and this server does not act on
(user, metadata, store, ...) are accepted and ignored, as other OpenAI-compatible servers do; a field
neither defines (a misspelled "temprature", another server's extra) is accepted too and named in the
response's IGNORED_HEADER (`unknown_fields`). The values are checked by the library (settings.py,
request.py), which names the parameter; temperature keeps OpenAI's range, 0 to 2, here.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from ..settings import SamplerSettings

_STRICT = ConfigDict(strict=True, extra="allow")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


# The sampler's request fields, from their one declaration (SamplerSettings.options(), `served`): OpenAI's
# temperature, top_p and penalties, and the toolkit's extras (vLLM and llama.cpp's server take top_k, min_p,
# repetition_penalty under these names). logit_bias is OpenAI's shape (string keys), declared below.
SAMPLER_FIELDS = [o.name for o in SamplerSettings.options() if o.served and o.kind is not dict]
OPENAI_RANGES = {"temperature": {"ge": 0, "le": 2, "allow_inf_nan": False}}  # OpenAI's bounds, narrower than ours
_Sampler = create_model(
    "_Sampler",
    __config__=_STRICT,
    **{
        o.name: (Optional[o.kind], Field(default=None, **OPENAI_RANGES.get(o.name, {})))
        for o in SamplerSettings.options()
        if o.name in SAMPLER_FIELDS
    },
)


class Sampling(_Sampler):
    """What both endpoints share: the model, budget, sampler, seed, stop strings, streaming."""

    model_config = _STRICT
    model: Optional[str] = None  # left out: the model this server serves, as llama-server and mlx-lm's take it
    max_tokens: Optional[int] = None
    n: int = 1
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logit_bias: Optional[dict[str, float]] = None

    @field_validator("n", "stream", "logprobs", "echo", mode="before", check_fields=False)
    @classmethod
    def _null_is_default(cls, value, info):
        """null as the field's default: OpenAI marks these nullable, and clients send unset fields so."""
        return cls.model_fields[info.field_name].default if value is None else value

    def settings(self) -> dict:
        """The sampler fields this request set, as SamplerSettings fields; the rest come from the
        model's generation_config.json (settings.resolve_settings), as in the CLI."""
        from .errors import ApiError

        out = {k: getattr(self, k) for k in SAMPLER_FIELDS if getattr(self, k) is not None}
        if self.logit_bias:
            # ASCII digits only: int() also reads " 1", "1_0" (as 10) and other scripts' digits
            if not all(t.isascii() and t.isdigit() for t in self.logit_bias):
                raise ApiError(400, "logit_bias maps token ids (as strings of digits) to biases", "logit_bias")
            out["logit_bias"] = {int(t): b for t, b in self.logit_bias.items()}
        return out


class ContentPart(BaseModel):
    model_config = _STRICT
    type: str
    text: Optional[str] = None


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = _STRICT
    id: str = ""
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None


class JsonSchemaFormat(BaseModel):
    model_config = _STRICT
    name: str = "response"
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class FunctionDef(BaseModel):
    model_config = _STRICT
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None


class CompletionRequest(Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


LLAMA_SERVER_NAMES = {  # ours: llama-server's
    "max_tokens": "n_predict",
    "repetition_penalty": "repeat_penalty",
    "penalty_window": "repeat_last_n",
}
_NO_LIMIT = {"n_predict", "repeat_last_n"}  # llama.cpp's -1: no limit, the whole context (here: the field unset)


def peer_fields(data: dict, chat: bool) -> dict:
    """A body with llama-server's and vLLM's names and values read as this server's: n_predict,
    repeat_penalty, repeat_last_n (-1: unset), seed -1 (a random seed: unset), guided_json (chat: a
    json_schema response_format). What would be dropped in silence is a 400 naming the fix: the two names
    of one field that differ, OpenAI's deprecated functions, vLLM's other guided_ fields."""
    from .errors import ApiError

    out = dict(data)
    for ours, theirs in LLAMA_SERVER_NAMES.items():
        if theirs not in out:
            continue
        value = out.pop(theirs)
        if theirs in _NO_LIMIT and type(value) is int and value == -1:
            continue
        if out.get(ours) is None:
            out[ours] = value
        elif out[ours] != value:
            raise ApiError(400, f"{ours} and {theirs} (llama-server's name for it) differ; send one", theirs)
    if type(out.get("seed")) is int and out["seed"] == -1:
        out["seed"] = None  # llama-server's "random": the server picks one and returns it
    for name in ("functions", "function_call"):
        if out.get(name) is not None:
            raise ApiError(400, f"{name} is OpenAI's deprecated form of tools; send tools (and tool_choice)", name)
    if out.get("guided_json") is not None:
        schema = out.pop("guided_json")
        if not chat or out.get("response_format") is not None:
            where = "beside response_format" if chat else "on /v1/completions"
            raise ApiError(400, f"guided_json is not read {where}; send response_format json_schema to "
                           "/v1/chat/completions", "guided_json")  # fmt: skip
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "guided_json", "schema": schema}}
    for name in ("guided_choice", "guided_regex", "guided_grammar"):
        if out.get(name) is not None:
            raise ApiError(400, f"{name} is vLLM's and not read here; response_format json_schema constrains a chat's "
                           "answer (an enum for a choice)", name)  # fmt: skip
    return out


IGNORED_HEADER = "mlxinfer-ignored-fields"
# fields OpenAI defines that this server accepts and does not act on: not named in IGNORED_HEADER
OPENAI_IGNORED = {
    "user", "metadata", "store", "parallel_tool_calls", "service_tier", "modalities", "audio", "prediction",
    "reasoning_effort", "web_search_options", "safety_identifier",
    "prompt_cache_key", "verbosity", "refusal",
}  # fmt: skip


def unknown_fields(model: BaseModel, at: str = "") -> list[str]:
    """The request's fields that neither OpenAI nor this server defines, as paths (messages[0].nam)."""
    out = [f"{at}{'.' if at else ''}{k}" for k in (model.model_extra or {}) if k not in OPENAI_IGNORED]
    for name in type(model).model_fields:
        value = getattr(model, name)
        path = f"{at}{'.' if at else ''}{name}"
        if isinstance(value, BaseModel):
            out += unknown_fields(value, path)
        elif isinstance(value, list):
            out += [
                f for i, v in enumerate(value) if isinstance(v, BaseModel) for f in unknown_fields(v, f"{path}[{i}]")
            ]
    return out
