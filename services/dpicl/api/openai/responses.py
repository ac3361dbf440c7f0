"""Response models of the OpenAI-compatible routes: OpenAI's shapes (a chat completion, a
text completion, a model and its list) with dpicl's extension, ``dpicl`` (what the answer
cost and the context's budget after it) and ``usage.dpicl`` (the same cost, named as the
X-DPICL-* headers). The requests are :mod:`dpicl.api.openai.protocol`'s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from dpicl.web.schemas import BudgetInfo, CostInfo


class DpiclAnswer(BaseModel):
    """dpicl's extension: what this answer cost and the context's budget after it."""

    context_id: str
    task: str
    mechanism: str
    engine: str
    label: str | None = Field(default=None, description="Classification: the released label.")
    cost: CostInfo
    budget: BudgetInfo


class UsageCost(BaseModel):
    """The privacy cost inside ``usage``, named as the X-DPICL-* headers: clients keep
    ``usage`` (LangChain's ``response_metadata["token_usage"]``, LiteLLM's ``usage``, the
    ``llm`` tool's logged token details) where they drop a top-level extension."""

    epsilon_spent: float = Field(description="This answer's epsilon as configured.")
    delta_spent: float = Field(description="This answer's delta.")
    context_epsilon_spent: float = Field(description="The context's ledger after it, at delta.")
    delta: float = Field(description="The delta of context_epsilon_spent.")
    epsilon_remaining: float | None = Field(
        default=None, description="What the context's budget has left (null: no budget)."
    )
    queries_remaining: int | None = Field(
        default=None, description="Answers the context's budget still admits (null: no limit)."
    )


class Usage(BaseModel):
    prompt_tokens: int = Field(description="0: dpicl does not count prompt tokens.")
    completion_tokens: int = Field(description="DPS-MOZO: the tokens released; else 0.")
    total_tokens: int
    dpicl: UsageCost = Field(description="dpicl's extension: the privacy cost of this answer.")


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
    engine: str = Field(description="The engine that answers (oracle: a simulator).")
    base_model: str = Field(description="The language model behind the context.")
    dtype: str | None = Field(
        default=None, description="The dtype of the model's weights (DPICL_DTYPE)."
    )
    load_format: str | None = Field(
        default=None,
        description="auto, or dummy: RANDOM weights for capacity planning (DPICL_LOAD_FORMAT).",
    )


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
