"""LLM engines and embedders behind one async protocol (see :mod:`dpicl.engines.base`)."""
