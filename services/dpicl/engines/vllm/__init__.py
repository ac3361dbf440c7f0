"""The vLLM engine (:mod:`.engine`): one ``AsyncLLM`` behind the Engine protocol."""
