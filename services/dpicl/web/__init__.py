"""The route kit: what every route needs, whoever contributes it (the app's routes or a
mechanism's own, such as DPS-MOZO's synthesis). Below the mechanisms, knowing none of them.

* :mod:`~dpicl.web.deps`: the running services, who a bearer token acts for, and
  :func:`~dpicl.web.deps.load_context`, the one scope check.
* :mod:`~dpicl.web.schemas`: the shared request and response shapes and the one error shape.
"""
