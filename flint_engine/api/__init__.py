"""The HTTP API: OpenAI's chat completions, completions and Responses API, Anthropic's Messages API (each a handler
on the chat path), protocol models, errors, auth and the FastAPI app."""
