"""OpenAI-compatible HTTP server (``sarathi serve``)."""
