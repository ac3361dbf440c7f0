"""The reference label scores that share no code path with the engine's scoring."""

from __future__ import annotations

import numpy as np
import torch

from dpicl.engines.base import PromptSpec
from dpicl.engines.transformers.engine import TransformersEngine

__all__ = ["whole_prompt_scores"]


def whole_prompt_scores(
    engine: TransformersEngine, prompts: list[PromptSpec], labels: list[str]
) -> np.ndarray:
    """One forward over the whole prompt plus the label per (prompt, label): no cache,
    batching, padding or 4D mask; the summed log-probability of the label's tokens."""
    out = np.zeros((len(prompts), len(labels)))
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            rendered, ids = engine.encode(p)
            for j, label in enumerate(labels):
                lab = engine.label_ids(rendered, label)
                x = torch.tensor([ids + lab], device=engine.device)
                logp = engine.model_obj(input_ids=x).logits[0].double().log_softmax(-1)
                out[i, j] = sum(float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(lab))
    return out
