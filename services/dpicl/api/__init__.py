"""The HTTP layer: thin routes over the answering service (:mod:`dpicl.serving`)."""
