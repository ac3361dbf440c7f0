"""The HTTP layer: thin routes over the pipelines."""
