"""OpenAI-compatible API server (FastAPI) over the in-process engine."""
