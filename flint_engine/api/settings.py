"""API-level settings: request limits, keys, logging and CORS. Every limit is configurable."""

from __future__ import annotations

from pydantic import BaseModel, Field, NonNegativeInt


class APISettings(BaseModel):
    model_name: str = "flint"
    default_max_tokens: int | None = Field(default=None, ge=1, description="None: the rest of the context")
    max_tokens_limit: int | None = Field(default=None, ge=1, description="cap on a request's max_tokens")
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    max_request_bytes: int = Field(default=8 * 2**20, ge=1024)
    max_n: int = Field(default=16, ge=1)
    max_top_logprobs: int = Field(default=20, ge=0, le=20)
    max_stop_sequences: int = Field(default=16, ge=0)
    max_stop_length: int = Field(default=256, ge=1)
    max_tools: int = Field(default=128, ge=0)
    max_tool_schema_bytes: int = Field(default=64 * 1024, ge=256)
    # Prompt log-probabilities (echo with logprobs, prompt_logprobs) keep a host entry a prompt token.
    max_prompt_logprobs_tokens: int = Field(default=32768, ge=1)
    # Thinking budgets where a request names none (`thinking_token_budget`, Anthropic's budget_tokens): by its
    # reasoning effort (OpenAI's reasoning_effort / Responses' reasoning.effort, Anthropic's output_config.effort),
    # e.g. {"low": 512, "medium": 2048}, else the server's default; None: the model thinks as long as it likes.
    thinking_token_budget: int | None = Field(default=None, ge=0)
    reasoning_effort_budgets: dict[str, NonNegativeInt] = Field(default_factory=dict)
    api_keys: list[str] = Field(default_factory=list)
    api_key_file: str | None = None
    protect_metrics: bool = False
    max_concurrent_per_key: int | None = Field(default=None, ge=1)
    # With API keys: each key's requests share prefix-cache blocks only with the same key's, so a tenant cannot tell
    # from its time to first token or `cached_tokens` what another sent (vLLM leaves this to each request's
    # cache_salt, which still applies within a key). Off: keys share a system prompt's blocks.
    isolate_prefix_cache: bool = False
    # A request's own `chat_template` (vLLM's --trust-request-chat-template): off, since a template is code, if
    # sandboxed, that a client would run on the router's CPU.
    trust_request_chat_template: bool = False
    # Request priorities (vLLM's `priority`, lower first): the lowest a client may ask for (None: any), so by default
    # a client can yield to others but not go ahead of them; and the priority a Batch API job's requests run at
    # (behind interactive traffic's 0) unless a line's body names one.
    min_request_priority: int | None = 0
    batch_priority: int = 1
    flex_priority: int = 1  # OpenAI's service_tier "flex" on a request that names no priority
    log_prompts: bool = False
    cors_origins: list[str] = Field(default_factory=list)
    disconnect_poll_s: float = Field(default=0.5, gt=0)
    # OpenAI's Batch API (/v1/files, /v1/batches): where uploaded files, batches and their results live (None: a new
    # temporary directory each start); an upload's and all files' byte caps; requests a batch keeps in flight; lines
    # a batch file may hold.
    batch_dir: str | None = None
    max_file_bytes: int = Field(default=200 * 2**20, ge=1024)
    max_stored_bytes: int = Field(default=10 * 2**30, ge=1024)
    batch_concurrency: int = Field(default=32, ge=1)
    max_batch_requests: int = Field(default=50_000, ge=1)
    # How long batch uploads and a batch's output and error files live unless the client says (OpenAI's
    # `expires_after` / `output_expires_after`, one hour to 30 days); None keeps them until deleted.
    batch_file_ttl_s: int | None = Field(default=30 * 24 * 3600, ge=3600, le=30 * 24 * 3600)
    # OpenAI's stored responses (`store`, `previous_response_id`, GET / DELETE /v1/responses/{id}) and conversations
    # (/v1/conversations, `conversation`): off unless set, as in vLLM (each stored turn is a file kept for
    # `response_ttl_s`, a conversation for as long after its last use); where they live (None: a new temporary
    # directory each start; conversations in its `conversations/`) and the bytes each kind may take (past that the
    # oldest go).
    store_responses: bool = False
    responses_dir: str | None = None
    response_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    max_stored_response_bytes: int = Field(default=2**30, ge=1024)
    max_background_responses: int = Field(default=64, ge=1)  # `background: true` responses running at once
