"""The process boundary: :mod:`.engine` (ProcessEngine, the server's side) and :mod:`.main`
(the engine process, ``python -m dpicl.engines.process.main FD``)."""
