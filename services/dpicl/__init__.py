"""dpicl: differentially private in-context learning server."""

__version__ = "0.1.0"
