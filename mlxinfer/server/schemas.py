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

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, field_validator

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
LLAMA_SERVER_NAMES = {
    "max_tokens": "n_predict",
    "repetition_penalty": "repeat_penalty",
    "penalty_window": "repeat_last_n",
}


def _field(name: str, **kw) -> Any:
    """A request field, also read under llama-server's name for it where that differs."""
    other = LLAMA_SERVER_NAMES.get(name)
    return Field(default=None, **kw, **({"validation_alias": AliasChoices(name, other)} if other else {}))


_Sampler = create_model(
    "_Sampler",
    __config__=_STRICT,
    **{
        o.name: (Optional[o.kind], _field(o.name, **OPENAI_RANGES.get(o.name, {})))
        for o in SamplerSettings.options()
        if o.name in SAMPLER_FIELDS
    },
)


class Sampling(_Sampler):
    """What both endpoints share: the model, budget, sampler, seed, stop strings, streaming."""

    model_config = _STRICT
    model: Optional[str] = None  # left out: the model this server serves, as llama-server and mlx-lm's take it
    max_tokens: Optional[int] = _field("max_tokens")
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


IGNORED_HEADER = "mlxinfer-ignored-fields"
# fields OpenAI defines that this server accepts and does not act on: not named in IGNORED_HEADER
OPENAI_IGNORED = {
    "user", "metadata", "store", "parallel_tool_calls", "service_tier", "modalities", "audio", "prediction",
    "reasoning_effort", "web_search_options", "functions", "function_call", "safety_identifier",
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
