"""The OpenAI-compatible surface: a context is a model (``/v1/models``,
``/v1/chat/completions``, ``/v1/completions``).

* :mod:`~dpicl.api.openai.router`: the routes (included by :func:`dpicl.api.app.build_app`).
* :mod:`~dpicl.api.openai.protocol`: OpenAI's request and response models; a request checks
  itself, names its query and converts itself to the native request.
* :mod:`~dpicl.api.openai.serving`: one answer through the native outcome functions (the
  context loaded once), and the response bodies, headers and model listing.
* :mod:`~dpicl.api.openai.streaming`: ``stream: true``, server-sent events.
* :mod:`~dpicl.api.openai.errors`: OpenAI's error shape on these paths.
"""
