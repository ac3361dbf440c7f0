"""Request models of the OpenAI-compatible routes (a context is a model; the responses:
:mod:`dpicl.api.openai.responses`).

A request checks itself (:meth:`~_Common.refuse_unsupported`), names its query
(:meth:`~ChatCompletionRequest.query`: the last message, which must be the user's, or the
prompt) and converts itself to the native request that ``/v1/classify`` or ``/v1/generate``
would get (:meth:`~_Common.to_native`), its validation errors named in OpenAI's terms.

Every field OpenAI defines for these requests is declared, so that an unknown field is a
400 naming it (``extra="forbid"``). Three kinds (docs/architecture.md lists them):

* honoured: ``model``, ``messages`` / ``prompt``, ``max_tokens`` (and
  ``max_completion_tokens``), ``stream``, ``stream_options.include_usage``, ``n`` = 1;
* accepted and ignored (harmless: they do not change what is released or what it costs):
  :data:`IGNORED`;
* refused with a 400 ``unsupported_parameter`` unless absent or neutral: :data:`REFUSED`.
  They would release un-noised internals (``logprobs``, ``top_logprobs``, ``echo``) or
  cannot be honoured by a DP mechanism (``n > 1``, ``tools``, ``response_format``, ``seed``,
  ``stop``, ``logit_bias``, ...).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)

from dpicl.domain import MAX_TEXT_CHARS, NONBLANK_NO_NUL
from dpicl.errors import InvalidRequest, UnsupportedParameter
from dpicl.web.schemas import ClassifyRequest, GenerateRequest

#: At most this many messages in a chat request (only the last one is read).
MAX_MESSAGES = 1000

#: Accepted and ignored: sampling knobs (the mechanism's sampling is fixed by the context,
#: and a client may not change it), bookkeeping fields, and ``parallel_tool_calls`` (no
#: tools are accepted, so it has nothing to act on).
IGNORED = (
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
)

#: Refused unless absent or neutral (the neutral values in :data:`NEUTRAL`).
REFUSED = (
    "logprobs",
    "top_logprobs",
    "echo",
    "n",
    "best_of",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "seed",
    "stop",
    "logit_bias",
    "suffix",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
)

#: Values of refused parameters that ask for nothing (what OpenAI does by default).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "echo": (None, False),
    "n": (None, 1),
    "best_of": (None, 1),
    "tools": (None, []),
    "functions": (None, []),
    # "none" asks the model to call no tool, which is all a context ever does (LangChain and
    # agent frameworks send it, with ``tools: []``, to turn tools off).
    "tool_choice": (None, "none"),
    "function_call": (None, "none"),
    "stop": (None, []),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
}

_WHY = {
    "logprobs": "token log-probabilities are un-noised internals of the model, which a "
    "differentially private answer never releases",
    "top_logprobs": "token log-probabilities are un-noised internals of the model, which a "
    "differentially private answer never releases",
    "echo": "dpicl releases only the mechanism's answer",
    "n": "each answer is a separate DP release, charged on its own; send n requests",
    "best_of": "each answer is a separate DP release, charged on its own",
    "seed": "DP noise and sampling are seeded from the operating system's entropy, never "
    "by a client",
    "stop": "the mechanisms release their answer whole",
    "logit_bias": "the mechanism's distribution cannot be changed by a client",
    "response_format": "a context answers with its label or a DP-generated text",
}


#: The two completion kinds: chat (``/v1/chat/completions``) and text (``/v1/completions``).
Kind = Literal["chat", "text"]


class Query(NamedTuple):
    """The query of an OpenAI request and the parameter it came from (named in errors)."""

    text: str
    param: str


def _native_error(exc: ValidationError, query_param: str) -> InvalidRequest:
    """A native request's validation error, named in OpenAI's terms."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else ""
    param = {"context_id": "model", "query": query_param}.get(field, field)
    what = "the query" if field == "query" else param
    msg = str(err["msg"]).lower()
    if err["type"] == "string_pattern_mismatch":
        msg = (
            "must contain a visible character (not only whitespace, control or invisible "
            "characters) and no NUL"
        )
    return InvalidRequest(f"{param}: {what} {msg}", param=param)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = Field(
        default=None, description="Send a last chunk with `usage` before `data: [DONE]`."
    )
    include_obfuscation: bool | None = Field(default=None, description="Ignored.")


def _integral(value: Any) -> Any:
    # JSON does not tell 46 from 46.0, nor does the published schema's "integer": an
    # integral float is that integer (issue 39). A boolean stays refused (strict).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A token count: a JSON integer (46 or 46.0), never a boolean or a string.
TokenCount = Annotated[int | None, BeforeValidator(_integral)]


def _only_neutral(schema: dict[str, Any]) -> None:
    # A refused parameter is typed loosely (any value reaches refuse_unsupported, whose 400
    # names it), but the published schema admits only its neutral values: what is accepted
    # (issue 39: schemathesis sent n=2 and logprobs=true as schema-valid requests).
    for name, prop in schema.get("properties", {}).items():
        if name in REFUSED:
            desc = prop.get("description")
            prop.clear()
            prop["enum"] = list(NEUTRAL.get(name, (None,)))
            if desc is not None:
                prop["description"] = desc


class _Common(BaseModel):
    """The fields chat and text completions share. Strict: ``"max_tokens": true`` or
    ``"stream": "yes"`` is a 400 naming the field, as OpenAI answers it, not a 1 or a True."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_only_neutral)

    #: ``chat`` or ``text``: the shape of the completion it is answered with.
    kind: ClassVar[Kind]

    model: str = Field(min_length=1, max_length=200, description="A context id.")
    stream: bool | None = Field(
        default=False,
        description="Server-sent events: DPS-MOZO streams its tokens as they are sampled; "
        "voting and ESA send their one released answer as a single chunk.",
    )
    stream_options: StreamOptions | None = None
    max_tokens: TokenCount = Field(
        default=None,
        ge=1,
        le=1024,
        description="Generation contexts: at most this many tokens (DPS-MOZO: at most the "
        "context's T_max). Ignored by classification contexts (one label).",
    )
    # Accepted and ignored (IGNORED).
    temperature: float | None = Field(default=None, ge=0, le=2, description="Ignored.")
    top_p: float | None = Field(default=None, ge=0, le=1, description="Ignored.")
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, description="Ignored.")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, description="Ignored.")
    user: str | None = Field(default=None, max_length=512, description="Ignored.")
    metadata: dict[str, str] | None = Field(default=None, description="Ignored.")
    store: bool | None = Field(default=None, description="Ignored.")
    service_tier: str | None = Field(default=None, max_length=64, description="Ignored.")
    # Refused unless neutral (REFUSED): typed loosely so that any value reaches the check,
    # which names the parameter.
    n: Any = Field(default=None, description="Only 1: each answer is its own DP release.")
    logprobs: Any = Field(default=None, description="Refused: un-noised internals.")
    logit_bias: Any = Field(default=None, description="Refused.")
    seed: Any = Field(default=None, description="Refused: DP noise comes from OS entropy.")
    stop: Any = Field(default=None, description="Refused (the mechanisms cannot honour it).")

    def refuse_unsupported(self) -> None:
        """A 400 naming the first parameter that would leak or that cannot be honoured."""
        for name in REFUSED:
            if name not in type(self).model_fields:
                continue
            value = getattr(self, name)
            neutral = NEUTRAL.get(name, (None,))
            # ``True == 1``: a boolean is only neutral where ``False`` is.
            if any(type(value) is type(v) and value == v for v in neutral) or value is None:
                continue
            shown = json.dumps(value)[:80] if value is not None else "null"
            why = _WHY.get(name, "a context answers with its label or a DP-generated text")
            raise UnsupportedParameter(
                f"{name}={shown} is not supported by dpicl: {why}", param=name
            )

    @abstractmethod
    def query(self) -> Query:
        """The query and the parameter it came from (each kind of request names its own)."""

    def max_tokens_wanted(self) -> int | None:
        return self.max_tokens

    def to_native(self, task: str, query: Query) -> ClassifyRequest | GenerateRequest:
        """The native request ``/v1/classify`` (``task`` classification) or
        ``/v1/generate`` would get for this one, whose query is ``query``."""
        try:
            if task == "classification":
                return ClassifyRequest(context_id=self.model, query=query.text)
            limit = self.max_tokens_wanted()
            if limit is None:
                return GenerateRequest(context_id=self.model, query=query.text)
            return GenerateRequest(context_id=self.model, query=query.text, max_tokens=limit)
        except ValidationError as exc:
            raise _native_error(exc, query.param) from None


#: A query's text in the published schema: what the native routes accept as ``query``.
_QUERY_TEXT: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TEXT_CHARS,
    "pattern": NONBLANK_NO_NUL,
}

#: A user message in the published schema: text, or a non-empty list of text parts (what
#: :meth:`ChatCompletionRequest.query` reads).
_USER_CONTENT: dict[str, Any] = {
    "required": ["content"],
    "properties": {
        "content": {
            "anyOf": [
                _QUERY_TEXT,
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": _QUERY_TEXT},
                    },
                },
            ]
        }
    },
}


def _messages_schema(schema: dict[str, Any]) -> None:
    # What the server reads, said in the schema (issue 39: schemathesis found requests the
    # schema admitted and the server refused): at least one user message, and every user
    # message with text (the last one is the query).
    schema["contains"] = {"properties": {"role": {"const": "user"}}, "required": ["role"]}
    schema["items"] = {
        **schema.get("items", {}),
        "if": {"properties": {"role": {"const": "user"}}},
        "then": _USER_CONTENT,
    }


class ChatMessage(BaseModel):
    """One message; only the last user message is read: it is the query."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = Field(
        default=None, description="Text, or a list of parts of type `text`."
    )


class ChatCompletionRequest(_Common):
    kind: ClassVar[Kind] = "chat"

    messages: list[ChatMessage] = Field(
        min_length=1,
        max_length=MAX_MESSAGES,
        description="The conversation; its last user message is the query (what follows it, "
        "an assistant's or a tool's message, is not read). Earlier messages are not read.",
        json_schema_extra=_messages_schema,
    )
    max_completion_tokens: TokenCount = Field(
        default=None, ge=1, le=1024, description="Same as max_tokens."
    )
    parallel_tool_calls: bool | None = Field(default=None, description="Ignored.")
    top_logprobs: Any = Field(default=None, description="Refused: un-noised internals.")
    tools: Any = Field(default=None, description="Refused.")
    tool_choice: Any = Field(default=None, description='Refused unless "none".')
    functions: Any = Field(default=None, description="Refused.")
    function_call: Any = Field(default=None, description='Refused unless "none".')
    response_format: Any = Field(default=None, description="Refused unless {type: text}.")
    modalities: Any = Field(default=None, description="Refused.")
    audio: Any = Field(default=None, description="Refused.")
    prediction: Any = Field(default=None, description="Refused.")
    reasoning_effort: Any = Field(default=None, description="Refused.")
    web_search_options: Any = Field(default=None, description="Refused.")

    def query(self) -> Query:
        """The last user message. Messages after it (an assistant's, a tool's) are not read,
        as the earlier ones are not: a conversation that ends in another role is accepted
        (the published schema says so), one without a user message is not."""
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if not users:
            raise InvalidRequest(
                "messages: no message has role 'user'; the last user message is the query",
                param="messages",
            )
        i = users[-1]
        last = self.messages[i]
        content = last.content
        if isinstance(content, str):
            return Query(content, f"messages.{i}.content")
        if not content:
            raise InvalidRequest(
                f"messages.{i}.content: the last user message has no text",
                param=f"messages.{i}.content",
            )
        texts = []
        for j, part in enumerate(content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise UnsupportedParameter(
                    f"messages.{i}.content.{j}: only parts of type 'text' with a string 'text' "
                    f"are supported (got type {str(part.get('type'))[:40]!r})",
                    param=f"messages.{i}.content.{j}.type",
                )
            texts.append(part["text"])
        return Query("\n".join(texts), f"messages.{i}.content")

    def max_tokens_wanted(self) -> int | None:
        """``max_tokens`` or ``max_completion_tokens`` (the same; both must agree)."""
        other = self.max_completion_tokens
        if self.max_tokens is not None and other is not None and self.max_tokens != other:
            raise InvalidRequest(
                f"max_tokens={self.max_tokens} and max_completion_tokens={other} differ; send one",
                param="max_completion_tokens",
            )
        return self.max_tokens if self.max_tokens is not None else other


class CompletionRequest(_Common):
    kind: ClassVar[Kind] = "text"

    prompt: Annotated[
        Any,
        # Typed loosely so that any value reaches query(), whose 400 says what is wrong;
        # the published schema says what is accepted (issue 39: it admitted null).
        WithJsonSchema(
            {
                "anyOf": [
                    _QUERY_TEXT,
                    {"type": "array", "minItems": 1, "maxItems": 1, "items": _QUERY_TEXT},
                ]
            }
        ),
    ] = Field(description="The query: a string (or a list holding one string).")
    echo: Any = Field(default=None, description="Refused: would return the prompt.")
    best_of: Any = Field(default=None, description="Only 1.")
    suffix: Any = Field(default=None, description="Refused.")

    def query(self) -> Query:
        """The prompt: one string (or a list holding one)."""
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return Query(prompt[0], "prompt")
        if isinstance(prompt, str):
            return Query(prompt, "prompt")
        raise UnsupportedParameter(
            f"prompt must be one string (or a list holding one); got {json.dumps(prompt)[:80]}: "
            "token ids are not accepted, and several prompts would be several DP releases "
            "(send one request each)",
            param="prompt",
        )


OpenAIRequest = ChatCompletionRequest | CompletionRequest
