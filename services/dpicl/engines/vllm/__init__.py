"""The vLLM engine (:mod:`.engine`): one ``AsyncLLM`` behind the Engine protocol; its
settings, engine arguments and per-context cache salt (:mod:`.options`)."""
