"""Request and response models of the OpenAI-compatible routes (a context is a model).

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

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpicl.api.schemas import BudgetInfo, CostInfo

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
    "stop": (None, []),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = Field(
        default=None, description="Send a last chunk with `usage` before `data: [DONE]`."
    )
    include_obfuscation: bool | None = Field(default=None, description="Ignored.")


class _Common(BaseModel):
    """The fields chat and text completions share. Strict: ``"max_tokens": true`` or
    ``"stream": "yes"`` is a 400 naming the field, as OpenAI answers it, not a 1 or a True."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=200, description="A context id.")
    stream: bool | None = Field(
        default=False,
        description="Server-sent events: DPS-MOZO streams its tokens as they are sampled; "
        "voting and ESA send their one released answer as a single chunk.",
    )
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(
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


class ChatMessage(BaseModel):
    """One message; only the last one (a user message) is read: it is the query."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = Field(
        default=None, description="Text, or a list of parts of type `text`."
    )


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(
        default=None, ge=1, le=1024, description="Same as max_tokens."
    )
    parallel_tool_calls: bool | None = Field(default=None, description="Ignored.")
    top_logprobs: Any = Field(default=None, description="Refused: un-noised internals.")
    tools: Any = Field(default=None, description="Refused.")
    tool_choice: Any = Field(default=None, description="Refused.")
    functions: Any = Field(default=None, description="Refused.")
    function_call: Any = Field(default=None, description="Refused.")
    response_format: Any = Field(default=None, description="Refused unless {type: text}.")
    modalities: Any = Field(default=None, description="Refused.")
    audio: Any = Field(default=None, description="Refused.")
    prediction: Any = Field(default=None, description="Refused.")
    reasoning_effort: Any = Field(default=None, description="Refused.")
    web_search_options: Any = Field(default=None, description="Refused.")


class CompletionRequest(_Common):
    prompt: Any = Field(description="The query: a string (or a list holding one string).")
    echo: Any = Field(default=None, description="Refused: would return the prompt.")
    best_of: Any = Field(default=None, description="Only 1.")
    suffix: Any = Field(default=None, description="Refused.")


# ---------------------------------------------------------------------------- responses


class DpiclAnswer(BaseModel):
    """dpicl's extension: what this answer cost and the context's budget after it."""

    context_id: str
    task: str
    mechanism: str
    engine: str
    label: str | None = Field(default=None, description="Classification: the released label.")
    cost: CostInfo
    budget: BudgetInfo


class Usage(BaseModel):
    prompt_tokens: int = Field(description="0: dpicl does not count prompt tokens.")
    completion_tokens: int = Field(description="DPS-MOZO: the tokens released; else 0.")
    total_tokens: int


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: None = None
    dpicl: DpiclAnswer


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage
    system_fingerprint: None = None
    dpicl: DpiclAnswer


class DpiclModel(BaseModel):
    """dpicl's extension of a model: the context's task, mechanism and budget left."""

    name: str | None
    task: str
    labels: list[str] = Field(description="Classification: the labels it answers.")
    mechanism: str
    epsilon: float = Field(description="Per-answer epsilon as configured (0 for public).")
    delta: float
    epsilon_exact: float | None = None
    budget: dict[str, float] | None = Field(description="The context's budget; null if none.")
    spent: BudgetInfo


class Model(BaseModel):
    id: str = Field(description="The context id.")
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dpicl"
    dpicl: DpiclModel


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
    has_more: bool = Field(description="More contexts follow: pass `last_id` as `after`.")
    first_id: str | None = None
    last_id: str | None = None
