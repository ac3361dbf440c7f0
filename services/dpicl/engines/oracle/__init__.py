"""The oracle (:mod:`.engine`): a deterministic, rule-following simulator of an ideal LLM."""
