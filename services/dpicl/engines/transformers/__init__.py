"""The Hugging Face transformers engine: :mod:`.engine` (the Engine protocol over a
:mod:`.runner`), its scoring, generation and DPS-MOZO decoding, and the KV layouts and caches
they share."""
