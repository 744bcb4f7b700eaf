"""Metrics of the work the API process runs itself, beside its engines': Batch API jobs (OpenAI's batches and
Anthropic's message batches, in this process's batch directory) and background responses.

Routers that share one batch directory each count all of its batches: take the max across routers, not the sum.
"""

from __future__ import annotations

from typing import Any

# Every batch status, so that each series exists from the start (at 0).
BATCH_STATUSES = (
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled",
)  # fmt: skip
BATCHES_DOC = "Batches by status (the Batch API's and Message Batches'), in this API process's batch directory."
GAUGES = {
    "batch_requests_remaining": "Requests of unfinished batches not answered yet (this API process's batch directory).",
    "background_responses_running": "Background responses (Responses API) generating in this API process.",
}


def api_snapshot(state: Any) -> dict[str, Any]:
    """The batch counts and background responses of an app's state (`app.state`: `batch_jobs`, `background`)."""
    counts, remaining = state.batch_jobs.status_counts()
    background = state.background
    return {
        "batches": {status: counts.get(status, 0) for status in BATCH_STATUSES},
        "batch_requests_remaining": remaining,
        "background_responses_running": background.running if background is not None else 0,
    }
