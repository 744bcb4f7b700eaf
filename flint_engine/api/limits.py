"""Request checks shared by the endpoints: an unknown model is a 404, each limit a 400 naming the parameter."""

from __future__ import annotations

from .backend import GenerationBackend
from .errors import APIError
from .protocol import SamplingFields
from .settings import APISettings


def check_common_request(req: SamplingFields, backend: GenerationBackend, s: APISettings) -> None:
    if req.model is not None and req.model != backend.model_name:
        raise APIError(404, f"The model '{req.model}' does not exist.", "model", "model_not_found")
    if req.n > s.max_n:
        raise APIError(400, f"n must be <= {s.max_n}, got {req.n}", "n")
    stops = req.stop_list()
    if len(stops) > s.max_stop_sequences:
        raise APIError(400, f"at most {s.max_stop_sequences} stop sequences are allowed, got {len(stops)}", "stop")
    for st in stops:
        if not st:
            raise APIError(400, "stop sequences must not be empty", "stop")
        if len(st) > s.max_stop_length:
            raise APIError(400, f"stop sequences must be at most {s.max_stop_length} characters", "stop")
    if s.min_request_priority is not None and request_priority(req, s) < s.min_request_priority:
        raise APIError(
            400,
            f"priority must be >= {s.min_request_priority} on this server (api.min_request_priority), got"
            f" {request_priority(req, s)}",
            "priority",
        )
    if req.max_tokens is not None and s.max_tokens_limit is not None and req.max_tokens > s.max_tokens_limit:
        raise APIError(400, f"max_tokens must be <= {s.max_tokens_limit}, got {req.max_tokens}", "max_tokens")


def request_priority(req: SamplingFields, s: APISettings) -> int:
    """The scheduling priority a request runs at: its own `priority` if it names one, else OpenAI's service tier's
    (flex: `api.flex_priority`; the others the default, 0)."""
    if "priority" in req.model_fields_set:
        return req.priority
    return s.flex_priority if req.service_tier == "flex" else 0


def check_prompt_logprobs(prompt_len: int, s: APISettings, field: str) -> None:
    """A request for its prompt's log-probabilities keeps an entry per prompt token on the host: within a cap."""
    if prompt_len > s.max_prompt_logprobs_tokens:
        raise APIError(
            400,
            f"the prompt's log-probabilities are returned for prompts of up to {s.max_prompt_logprobs_tokens}"
            f" tokens; this one has {prompt_len}",
            field,
        )


def resolve_max_tokens(
    requested: int | None, prompt_len: int, backend: GenerationBackend, s: APISettings, field: str = "messages"
) -> int:
    """The request's max_tokens, or the default: the rest of the context (capped by the server's settings).

    `field` names what the prompt came from in errors: the chat's "messages" or the completion's "prompt"."""
    if s.max_prompt_tokens is not None and prompt_len > s.max_prompt_tokens:
        raise APIError(
            400,
            f"the prompt has {prompt_len} tokens; this server accepts at most {s.max_prompt_tokens}",
            field,
            "prompt_too_long",
        )
    limit = min(backend.max_model_len, backend.max_context)
    if prompt_len >= limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your {field} resulted in"
            f" {prompt_len} tokens. Please reduce the length of the {field}.",
            field,
            "context_length_exceeded",
        )
    if requested is not None:
        if s.max_tokens_limit is not None and requested > s.max_tokens_limit:
            raise APIError(400, f"max_tokens must be <= {s.max_tokens_limit}, got {requested}", "max_tokens")
        return requested
    default = limit - prompt_len
    if s.default_max_tokens is not None:
        default = min(default, s.default_max_tokens)
    if s.max_tokens_limit is not None:
        default = min(default, s.max_tokens_limit)
    return default


def truncate_prompt(ids: list[int], keep: int | None, backend: GenerationBackend, side: str | None = None) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: the prompt's last `keep` tokens (-1: the model's context length), or its
    first with `side` "right" (vLLM's `truncation_side`); None keeps it whole."""
    if keep is None:
        return ids
    if keep == -1:
        keep = backend.max_model_len
    elif keep > backend.max_model_len:
        raise APIError(
            400,
            f"truncate_prompt_tokens ({keep}) is larger than the model's context length ({backend.max_model_len})",
            "truncate_prompt_tokens",
        )
    return ids[:keep] if side == "right" else ids[-keep:]
