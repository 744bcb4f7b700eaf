"""The OpenAI-compatible HTTP API: protocol models, handlers, errors, auth and the FastAPI app."""
