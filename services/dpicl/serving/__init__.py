"""What the server does for a request, whichever surface asked (dpicl's own routes, the
OpenAI-compatible ones, the white-box ones): above the mechanisms (it asks the registry),
below every route, which only shapes what it returns.

* :mod:`~dpicl.serving.contexts`: creating a context (checks, calibration by its mechanism,
  budget) and one answer's cost event.
* :mod:`~dpicl.serving.answers`: one answer of a context's mechanism, within the caller's
  scope, charged and counted.
* :mod:`~dpicl.serving.listing`: a page of the contexts a key reaches, and its cursors.
"""
