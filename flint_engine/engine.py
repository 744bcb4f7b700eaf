"""The synchronous engine: requests in, one scheduled step at a time, token/text deltas out."""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from flint_kernels import precompile
from flint_kernels.dispatch import select_kernels

from .bad_words import bad_word_sequences, banned_by_bad_words, bans_before_reading
from .config import FlintConfig
from .engine_config import EngineConfig
from .kv_cache import KVCache
from .kv_cache_manager import KVCacheManager
from .kv_cache_plan import KVCachePlan, gpu_kv_budget, plan_kv_cache
from .late_compiles import WATCH as LATE_COMPILES
from .metrics import EngineMetrics
from .model import FlintModel
from .model_runner import ModelRunner
from .output_constraint import OutputConstraint, output_constraint, token_filter
from .parsers.reasoning import TOOL_CALL_START
from .prefill_warmup import warm_up_prefill
from .request import Request
from .sampler import (
    SampleResult,
    SamplingRow,
    apply_device_penalties,
    apply_static_masks,
    device_logprobs,
    draw_tokens,
    is_plain,
    logprob_lists,
    raw_logprobs,
    sample,
)
from .sampling_params import SamplingParams
from .scheduler import ScheduledChunk, Scheduler
from .step_graphs import MAX_TOKENS as STEP_GRAPH_MAX_TOKENS
from .stop_strings import StopStringText
from .token_readback import TokenReadback
from .tool_call_prefix import TAGS as TOOL_CALL_TAGS
from .tool_call_prefix import ToolCallPrefix, tool_call_prefix

log = logging.getLogger(__name__)
_offline_ids = itertools.count()


class EngineRequestError(ValueError):
    """A request the engine cannot take as given (4xx); `param` names the field when there is one."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class EngineOverloaded(RuntimeError):
    """The waiting queue is full: shed load (503) rather than queue without bound."""


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    # per new token: (token id, logprob, [(alt id, alt logprob), ...])
    new_logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    error: str | None = None
    # With the first token, when asked for (SamplingParams.prompt_logprobs): per prompt position, None for the first.
    prompt_logprobs: list[tuple[int, float, list[tuple[int, float]], int] | None] | None = None


@dataclass
class _Launched:
    """A step whose GPU work is queued: its chunks, the requests of its sampled rows, and their tokens, on the device
    and not read yet (`tokens`) or already on the host (`result`, when sampling needed the host)."""

    chunks: list[ScheduledChunk]
    reqs: list[Request]
    tokens: TokenReadback | None = None
    result: SampleResult | None = None
    rows: list[SamplingRow] | None = None  # with `tokens`: the rows drawn (their logprobs read with the tokens)
    # Rows launched ahead, drawn free, of requests whose input token (not read when the row was launched) may wake
    # rules on their next token (a held tool call, a constraint after the reasoning): such a row is dropped and its
    # position decoded again under the rules (`LLMEngine._rows_to_redo`).
    may_wake_rules: tuple[int, ...] = ()


@dataclass
class _TextState:
    detok: Any | None
    stops: StopStringText
    logprobs: bool
    pending_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    constraint: OutputConstraint | None = None  # JSON mode, a choice or a pattern, once active
    reasoning: bool = False  # the output is inside its reasoning (before params.reasoning_end_token)
    tool_call: ToolCallPrefix | None = None  # tool calls held to the offered tools (tool_names, tool_schemas)
    bad_words: tuple[tuple[int, ...], ...] = ()  # params.bad_words as token sequences (bad_words.py)


class LLMEngine:
    def __init__(
        self,
        model: FlintModel,
        tokenizer: Any | None,
        engine_config: EngineConfig,
        generation_defaults: dict[str, Any] | None = None,
        kv_plan: KVCachePlan | None = None,
        precompiling: precompile.Pending | None = None,
    ) -> None:
        """`precompiling`: the kernel precompile `from_checkpoint` started while the weights loaded."""
        self.model = model
        self.config: FlintConfig = model.config
        self.tokenizer = tokenizer
        # A tool call the model opens inside its reasoning ends the reasoning (as the reasoning parser reads it), so
        # a thinking budget stops counting there rather than forcing </think> into the call.
        self._tool_call_token = tokenizer.token_to_id(TOOL_CALL_START) if tokenizer is not None else None
        # The special tokens a held tool call writes (<tool_call>, <arg_key>, ...): the others never come inside one.
        ids = (tokenizer.token_to_id(t.decode()) for t in TOOL_CALL_TAGS) if tokenizer is not None else ()
        self._tool_call_tags = tags = frozenset(i for i in ids if i is not None)
        self._special_outside_calls = frozenset(tokenizer.special_token_ids) - tags if tokenizer is not None else ()
        self.engine_config = ec = engine_config
        self.generation_defaults = dict(generation_defaults or {})
        self.max_model_len = min(
            ec.max_model_len or self.config.max_position_embeddings, self.config.max_position_embeddings
        )
        fused_on_gpu = model.device.type == "cuda" and model.kernels.name != "reference"
        # The largest step: prefill-only steps may take more tokens than max_num_batched_tokens (EngineConfig).
        self.prefill_tokens = ec.prefill_tokens(fused_on_gpu)
        # The largest step on step graphs (0: none); the KV budget keeps their pool's memory free.
        graphs = fused_on_gpu and ec.cuda_graphs and ec.step_graphs
        self.step_graph_tokens = min(self.prefill_tokens, STEP_GRAPH_MAX_TOKENS) if graphs else 0
        self.plan = kv_plan or plan_kv_cache(
            self.config, self._kv_budget(), ec.block_size, ec.max_num_seqs, self.prefill_tokens
        )
        self.cache = KVCache(
            self.config,
            self.plan.num_full_blocks,
            self.plan.num_sliding_blocks,
            ec.block_size,
            model.dtype,
            model.device,
        )
        self.kv = KVCacheManager(
            self.config,
            self.plan.num_full_blocks,
            self.plan.num_sliding_blocks,
            ec.block_size,
            ec.enable_prefix_caching,
        )
        self.scheduler = Scheduler(self.kv, ec.max_num_seqs, ec.max_num_batched_tokens, self.prefill_tokens)
        self.runner = ModelRunner(model, self.cache, self.kv)
        self.metrics = EngineMetrics()
        self.requests: dict[str, Request] = {}
        self.text: dict[str, _TextState] = {}
        # With `async_decode`: the decode step launched behind the one being read (its tokens not read yet).
        self._ahead: _Launched | None = None
        self.steps_ahead = 0  # steps launched that way (for tests and benchmarks)
        self.rows_redone = 0  # rows of those dropped and decoded again (rules woke under them: `_rows_to_redo`)
        eos = set(self.config.eos_token_id)
        if tokenizer is not None:
            eos |= set(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.eos_token_ids = frozenset(eos)
        self.max_context = min(
            self.max_model_len, self.plan.token_capacity if self.config.full_layers else self.max_model_len
        )
        log.info("%s; longest admissible context %d tokens", self.plan.describe(), self.max_context)
        log.info("step budget: %d tokens, %d in prefill-only steps", ec.max_num_batched_tokens, self.prefill_tokens)
        self.precompile_report: precompile.Report | None = None
        if fused_on_gpu and ec.precompile_kernels:
            self.precompile_report = self._precompile(precompiling)
        elif precompiling is not None:
            precompiling.cancel()
        # What the warm-up compiles itself (a manifest would list it: benchmarks/cold_start.py --record).
        graph_batch = min(ec.max_num_seqs, 128)  # the largest decode graph's batch
        if fused_on_gpu:
            self.runner.align_eager_decode(self.max_context, graph_batch)
        with precompile.Recorder() as compiled:
            if fused_on_gpu and ec.prefill_warmup:
                warm_up_prefill(model, self.cache, self.prefill_tokens, ec.max_num_seqs, (ec.max_num_batched_tokens,))
            if fused_on_gpu and ec.cuda_graphs:
                self.runner.enable_cuda_graphs(graph_batch, self.max_context)
                if self.step_graph_tokens:
                    self.runner.enable_step_graphs(self.step_graph_tokens)
        self.warmup_compiles = compiled.entries
        if fused_on_gpu:
            log.info("the warm-up compiled %d Triton kernel variants the manifest did not list", len(compiled.entries))
        # From here on a Triton compile is a stall inside some request's step: logged and counted.
        self.watches_compiles = fused_on_gpu and LATE_COMPILES.arm()

    def _precompile(self, precompiling: precompile.Pending | None) -> precompile.Report | None:
        """Compile the manifest's kernels for this model, or finish the compile started during the load."""
        profile = self.model.weights.kernel_profile()
        if precompiling is not None:
            t0 = time.monotonic()
            report = precompiling.wait()
            log.info("the kernel precompile begun with the load ended %.1f s after it", time.monotonic() - t0)
            if precompiling.profile == profile:
                return report
            log.warning(
                "the checkpoint header gave kernel profile %s but the weights have %s: compiling for the weights",
                precompiling.profile,
                profile,
            )
        return precompile.run(self.model.device, profile)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, engine_config: EngineConfig, progress: bool = True) -> LLMEngine:
        from .checkpoint import kernel_profile, load_checkpoint, open_source
        from .default_model import default_checkpoint_path
        from .random_model import is_random_spec, load_random_model

        device = engine_config.resolve_device()
        dtype = engine_config.resolve_dtype(device)
        kernels = select_kernels(device, dtype, dtype, engine_config.kernels)
        if is_random_spec(engine_config.model):
            weights, tokenizer, defaults = load_random_model(engine_config.model, dtype, device)  # type: ignore[arg-type]
            return cls(FlintModel(weights, kernels), tokenizer, engine_config, defaults)
        path = engine_config.model or str(default_checkpoint_path())
        src = open_source(path)
        precompiling = None
        if device.type == "cuda" and kernels.name != "reference" and engine_config.precompile_kernels:
            # The kernels depend on the weights' format, not their values: compile them while the weights load.
            precompiling = precompile.start(device, kernel_profile(src, dtype))
        try:
            t0 = time.monotonic()
            ck = load_checkpoint(path, dtype=dtype, device=device, progress=progress, source=src)
            log.info("loaded %s (%s) in %.1f s", path, ck.format, time.monotonic() - t0)
            model = FlintModel(ck.weights, kernels)
            return cls(model, ck.tokenizer, engine_config, ck.generation_defaults, precompiling=precompiling)
        except BaseException:
            if precompiling is not None:  # a failed start leaves no compile workers behind
                precompiling.cancel()
            raise

    def _kv_budget(self) -> int:
        ec = self.engine_config
        if ec.kv_cache_memory is not None:
            return ec.kv_cache_memory
        dev = self.model.device
        if dev.type == "cuda":
            from flint_kernels.moe_triton import copies_min_tokens, paths_config

            free, total = torch.cuda.mem_get_info(dev)
            return gpu_kv_budget(
                self.config,
                free,
                total,
                ec.gpu_memory_utilization,
                ec.max_num_seqs,
                self.prefill_tokens,
                self.model.weights.has_nvfp4_experts(),
                # The GPU's table may start the copies earlier, or take steps on launches that need none.
                copies_min_tokens(paths_config(True, dev)),
                self.step_graph_tokens,
            )
        return 512 * 2**20

    # ------------------------------------------------------------------ requests
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise EngineRequestError for a request this engine can never serve (reads only fixed settings, so it is
        safe to call from any thread before the request is queued)."""
        n = len(prompt_token_ids)
        if not prompt_token_ids:
            raise EngineRequestError("the prompt is empty", param="prompt")
        vocab = self.config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise EngineRequestError(f"token id {bad} is outside the vocabulary of {vocab}", param="prompt")
        if n + params.max_tokens > self.max_model_len:
            raise EngineRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested"
                f" {n + params.max_tokens} tokens ({n} in the messages, {params.max_tokens} in the completion)."
                " Please reduce the length of the messages or completion.",
                param="messages",
                code="context_length_exceeded",
            )
        if n + params.max_tokens > self.max_context:
            raise EngineRequestError(
                f"the KV cache holds at most {self.max_context} tokens of context on this server; the request needs"
                f" {n + params.max_tokens} ({n} prompt + {params.max_tokens} max_tokens)",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if params.stop_token_ids:
            bad = next((t for t in params.stop_token_ids if t >= vocab), None)
            if bad is not None:
                msg = f"stop_token_ids names token id {bad}, outside the vocabulary of {vocab}"
                raise EngineRequestError(msg, param="stop_token_ids")
        if params.logit_bias:
            bad = next((t for t in params.logit_bias if t >= vocab), None)
            if bad is not None:
                msg = f"logit_bias names token id {bad}, outside the vocabulary of {vocab}"
                raise EngineRequestError(msg, param="logit_bias")
        if params.allowed_token_ids:
            bad = next((t for t in params.allowed_token_ids if t >= vocab), None)
            if bad is not None:
                msg = f"allowed_token_ids names token id {bad}, outside the vocabulary of {vocab}"
                raise EngineRequestError(msg, param="allowed_token_ids")
        if params.reasoning_end_token is not None and params.reasoning_end_token >= vocab:
            msg = f"reasoning_end_token {params.reasoning_end_token} is outside the vocabulary of {vocab}"
            raise EngineRequestError(msg, param="reasoning_end_token")
        if params.constrained and self.tokenizer is None:
            msg = "an output constraint (JSON, choice, regex or grammar) needs a tokenizer"
            raise EngineRequestError(msg, param="response_format")
        if (params.tool_names is not None or params.tool_schemas is not None) and self.tokenizer is None:
            raise EngineRequestError("a forced or strict tool call needs a tokenizer", param="tool_choice")
        if params.bad_words and self.tokenizer is None:
            raise EngineRequestError("bad_words needs a tokenizer", param="bad_words")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> Request:
        if request_id in self.requests:
            raise EngineRequestError(f"request id {request_id!r} is already in use", param="request_id")
        self.check_request(prompt_token_ids, params)
        if params.n != 1:
            # A request is one sequence here; AsyncEngine, the API and flint_engine.LLM make n choices n requests.
            msg = f"add_request runs one sequence (n={params.n}): add n requests, or use AsyncEngine or LLM"
            raise EngineRequestError(msg, param="n")
        if len(self.scheduler.waiting) >= self.engine_config.max_waiting_requests:
            raise EngineOverloaded(f"{len(self.scheduler.waiting)} requests are already waiting")
        params = params.with_defaults(self.generation_defaults)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        req = Request(request_id, list(prompt_token_ids), params, seed, self.eos_token_ids)
        self.requests[request_id] = req
        detok = None
        if self.tokenizer is not None:
            from .detokenizer import IncrementalDetokenizer

            detok = IncrementalDetokenizer(self.tokenizer, list(prompt_token_ids), params.skip_special_tokens)
        self.text[request_id] = _TextState(
            detok,
            StopStringText(params.stop, params.include_stop_str_in_output),
            params.logprobs is not None,
            constraint=output_constraint(params) if params.constrained and params.reasoning_end_token is None else None,
            tool_call=tool_call_prefix(params.tool_names, params.tool_schemas),
            reasoning=params.reasoning_end_token is not None,
            bad_words=bad_word_sequences(self.tokenizer, params.bad_words) if params.bad_words else (),
        )
        self.scheduler.add(req)
        with self.metrics.lock:
            self.metrics.num_waiting = len(self.scheduler.waiting)
        return req

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        out = self._finish(req, "abort", None, [], "")
        self._update_gauges(stepped=False)
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._ahead is not None

    # ------------------------------------------------------------------ stepping
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one step: schedule it (or take the decode step already launched behind the last one), launch its
        forward and sampling, then read its tokens and turn them into outputs.

        With `EngineConfig.async_decode`, before reading a decode step's tokens the engine launches the next decode
        step on the same requests, fed with those tokens on the device, so the GPU does not wait while the host
        appends tokens, detokenises and schedules. A request that finishes meanwhile (a stop token or string, an
        abort) has its row of that next step dropped."""
        launched, self._ahead = self._ahead, None
        if launched is None:
            sched = self.scheduler.schedule()
            if not sched.chunks:
                self._update_gauges()
                return []
            try:
                launched = self._launch(sched.chunks)
            except Exception as exc:  # a failed step must not lose the requests in it
                return self._fail(sched.chunks, exc)
        if self.engine_config.async_decode:
            self._ahead = self._launch_ahead(launched)
        outputs = self._collect(launched)
        self._update_gauges()
        return outputs

    def _fail(self, chunks: list[ScheduledChunk], exc: Exception) -> list[RequestOutput]:
        log.exception("model step failed; failing %d requests", len(chunks))
        outputs = []
        for ch in chunks:
            out = self._finish(ch.request, "error", None, [], "")
            out.error = f"internal error during generation: {type(exc).__name__}"
            outputs.append(out)
        self._update_gauges()
        return outputs

    def _launch(self, chunks: list[ScheduledChunk]) -> _Launched:
        logits, rows = self.runner.execute(chunks)
        launched = _Launched(chunks, [chunks[i].request for i in rows])
        if logits is not None:
            srows = [self._sampling_row(r) for r in launched.reqs]
            draw = self.model.kernels.sample_top_k
            if all(is_plain(r, logits.shape[-1]) for r in srows):
                launched.tokens, launched.rows = self._draw_on_device(logits, srows), srows  # read in `_collect`
            else:
                launched.result = sample(logits, srows, draw)
        return launched

    def _launch_ahead(self, prev: _Launched) -> _Launched | None:
        """The decode step after `prev` (in flight) on its requests, launched before `prev`'s tokens are read, or
        None where that is not possible: `prev` is not a plain decode step of every running request on graphs, one
        needs the host to sample (an open constraint or held tool call among them), a request waits for admission
        and a sequence slot is free or a running request of a higher priority value to preempt, or blocks are short
        (then the regular schedule decides, preempting if it must). Requests that end with `prev` by their length are
        left out of it. With every slot taken, requests that wait (a saturated server) do not stop it: one that would
        take the slot of a request stopping in `prev` is admitted a step later. A request whose rules may wake
        (`_may_hold`) goes ahead drawn free; if `prev`'s token woke them, its row is dropped (`_rows_to_redo`)."""
        if self.runner.graphs is None or prev.tokens is None or len(prev.reqs) != len(prev.chunks):
            return None
        if self.scheduler.has_free_seat() or self.scheduler.would_preempt():
            return None
        if len(prev.chunks) != len(self.scheduler.running):  # every running request, none finished since
            return None
        keep, rows, may_wake_rules = [], [], []
        for i, ch in enumerate(prev.chunks):
            req = ch.request
            if req.is_finished or ch.num_tokens != 1 or req.num_computed_tokens + 1 != req.num_tokens:
                return None
            if self._held(req):  # its next token is held to rules that `prev`'s token moves
                return None
            if self._thinking_budget_spent(req, ahead=1):  # whether `prev`'s token closed the reasoning is not read
                return None
            if len(req.output_token_ids) + 1 >= req.params.max_tokens or req.num_tokens + 1 >= self.max_model_len:
                continue  # ends with `prev`'s token
            row = self._sampling_row(req, ahead=1)
            if not is_plain(row, self.config.vocab_size):
                return None
            if self._may_hold(req):
                may_wake_rules.append(len(keep))
            keep.append(i)
            rows.append(row)
        if not keep:
            return None
        chunks = [prev.chunks[i] for i in keep]
        for ch in chunks:  # blocks for the next position (kept if this gives up: the next step needs them too)
            req = ch.request
            if not self.kv.can_allocate(req.request_id, req.num_computed_tokens + 1, 1):
                return None
            self.kv.allocate(req.request_id, req.num_computed_tokens + 1, 1)
        try:
            inputs = prev.tokens.device_rows(keep)
            logits = self.runner.execute_ahead(chunks, inputs)
            if logits is None:
                return None
            tokens = self._draw_on_device(logits, rows, inputs)  # (`inputs`: counted by the rows' penalties)
        except Exception:  # the regular path recomputes this step; it reports a persistent failure itself
            log.exception("launching a decode step ahead failed; continuing one step at a time")
            return None
        self.steps_ahead += 1
        reqs = [ch.request for ch in chunks]
        chunks = [ScheduledChunk(r, 1) for r in reqs]
        return _Launched(chunks, reqs, tokens, rows=rows, may_wake_rules=tuple(may_wake_rules))

    def _draw_on_device(
        self, logits: torch.Tensor, rows: list[SamplingRow], last: torch.Tensor | None = None
    ) -> TokenReadback:
        """The `is_plain` rows' tokens (with their penalties, biases, allowed ids and bans), and their logprobs where
        asked, drawn on the device and on their way to the host (nothing waits for them here). `last`: the rows'
        latest tokens, on the device only (a step launched ahead)."""
        raw = raw_logprobs(logits, rows)
        logits = apply_static_masks(apply_device_penalties(logits, rows, last), rows)
        tokens = draw_tokens(logits, rows, self.model.kernels.sample_top_k)
        return TokenReadback(tokens, device_logprobs(raw, tokens, rows) if raw is not None else ())

    @staticmethod
    def _read(launched: _Launched) -> SampleResult:
        """The step's tokens and logprobs on the host (waiting for the device to make them)."""
        if launched.result is not None:
            return launched.result
        if launched.tokens is None:
            return SampleResult([], None, None)
        token_ids = launched.tokens.tolist()
        extras = launched.tokens.extras()
        if not extras:
            return SampleResult(token_ids, None, None)
        return SampleResult(token_ids, *logprob_lists(*extras, launched.rows or []))

    def _collect(self, launched: _Launched) -> list[RequestOutput]:
        """Read the step's tokens (waiting for the GPU) and turn them into outputs; rows of requests that finished
        after the step was launched are dropped."""
        result = self._read(launched)
        token_ids = result.token_ids
        # Stamped once the tokens are on the host: on a GPU `execute` only queues the step's kernels, and an earlier
        # stamp would leave the step's GPU time out of TTFT and the inter-token latency.
        now = time.monotonic()
        redo = self._rows_to_redo(launched)
        live = [ch for ch in launched.chunks if not ch.request.is_finished and id(ch.request) not in redo]
        with self.metrics.lock:
            self.metrics.computed_tokens += sum(ch.num_tokens for ch in live)
        for ch in live:
            req = ch.request
            req.num_computed_tokens += ch.num_tokens
            self.kv.computed(req.request_id, req.tokens, req.num_computed_tokens)
        outputs = []
        for j, req in enumerate(launched.reqs):
            if req.is_finished or id(req) in redo:
                continue
            lp = None
            if result.logprobs is not None and req.params.logprobs is not None:
                lp = (result.logprobs[j], result.top_logprobs[j] if result.top_logprobs else [])
            out = self._append_token(req, token_ids[j], lp, now)
            if out is not None:
                if req.prompt_logprobs is not None and len(req.output_token_ids) == 1:
                    out.prompt_logprobs = req.prompt_logprobs
                outputs.append(out)
        return outputs

    def _held(self, req: Request) -> bool:
        """Whether the request's next token is held to rules the host reads off its output: an output constraint
        (after the reasoning, when thinking), or a held tool call that is open."""
        state = self.text[req.request_id]
        return state.constraint is not None or (state.tool_call is not None and state.tool_call.active)

    def _may_hold(self, req: Request) -> bool:
        """Whether a token may wake such rules: the end of the reasoning (a constraint after it; the host writes that
        end for an end-of-turn token), or `<tool_call>` (held calls)."""
        state = self.text[req.request_id]
        after_reasoning = req.params.constrained and state.constraint is None
        return after_reasoning or (state.tool_call is not None and not state.tool_call.done)

    def _rows_to_redo(self, launched: _Launched) -> set[int]:
        """The requests (ids) whose row in a step launched ahead was drawn free though its input token, read since,
        woke rules on their next token (or was rewritten: an end of turn inside the reasoning read as its end): the
        row's token is dropped and the position decoded again from the host's token (its KV entries rewritten)
        with the rules on the draw."""
        redo = {id(r) for j in launched.may_wake_rules if not (r := launched.reqs[j]).is_finished and self._held(r)}
        self.rows_redone += len(redo)
        return redo

    def _thinking_budget_spent(self, req: Request, ahead: int = 0) -> bool:
        """Whether the request's next token (`ahead` = 1: the one after) must close its reasoning, its thinking budget
        spent."""
        budget = req.params.thinking_token_budget
        reasoning = self.text[req.request_id].reasoning
        return reasoning and budget is not None and len(req.output_token_ids) + ahead >= budget

    def _sampling_row(self, req: Request, ahead: int = 0) -> SamplingRow:
        """The request's sampling row for its next token (`ahead` = 1: the one after, its next not yet read)."""
        t, p, k, m = req.params.effective()
        banned: tuple[int, ...] = ()
        if len(req.output_token_ids) + ahead < req.params.min_tokens:
            banned = tuple(
                sorted(set(req.params.stop_token_ids) | (set() if req.params.ignore_eos else req.eos_token_ids))
            )
        state = self.text[req.request_id]
        banned_after: tuple[tuple[int, int], ...] = ()
        if state.bad_words and ahead:  # the latest token is not read: the bans it would set off go to the device
            always, banned_after = bans_before_reading(state.bad_words, req.output_token_ids)
            banned = tuple(sorted(set(banned) | always))
        elif state.bad_words:
            banned = tuple(sorted(set(banned) | banned_by_bad_words(state.bad_words, req.output_token_ids)))
        allowed_ids = req.params.allowed_token_ids
        if self._thinking_budget_spent(req, ahead):
            allowed_ids = (req.params.reasoning_end_token,)  # close the reasoning
        allowed, dead_end = None, None
        if state.constraint is not None:
            allowed = self._output_constraint(req, state.constraint)
        elif state.tool_call is not None and state.tool_call.active:
            allowed = self._tool_call_constraint(req, state.tool_call)
        if allowed is not None:  # where no token may follow (a pattern nothing goes on with, say), the turn ends
            ends = req.params.stop_token_ids or sorted(req.eos_token_ids)
            dead_end = ends[0] if ends else None
        return SamplingRow(
            allowed=allowed,
            temperature=t,
            top_p=p,
            top_k=k,
            min_p=m,
            seed=req.seed,
            step=len(req.output_token_ids) + ahead,
            presence_penalty=req.params.presence_penalty,
            frequency_penalty=req.params.frequency_penalty,
            repetition_penalty=req.params.repetition_penalty,
            logit_bias=req.params.logit_bias,
            allowed_ids=allowed_ids,
            output_ids=req.output_token_ids,
            prompt_ids=req.prompt_token_ids if req.params.repetition_penalty != 1.0 else (),
            banned_ids=banned,
            banned_after=banned_after,
            logprobs=req.params.logprobs,
            dead_end=dead_end,
        )

    def _output_constraint(self, req: Request, prefix: OutputConstraint) -> Any:
        stops = set(req.eos_token_ids) | set(req.params.stop_token_ids)
        return token_filter(prefix, self.tokenizer.token_bytes, stops, self.tokenizer.special_token_ids)

    def _tool_call_constraint(self, req: Request, prefix: ToolCallPrefix) -> Any:
        stops = set(req.eos_token_ids) | set(req.params.stop_token_ids)
        tags = self._tool_call_tags
        return token_filter(prefix, self.tokenizer.token_bytes, stops, self._special_outside_calls, tags)

    def _append_token(
        self, req: Request, token: int, lp: tuple[float, list[tuple[int, float]]] | None, now: float
    ) -> RequestOutput | None:
        state = self.text[req.request_id]
        ends_turn = token in req.eos_token_ids or token in req.params.stop_token_ids
        if req.params.constrained and state.constraint is None and ends_turn:
            # A constraint after the thinking: ending the turn inside the reasoning closes the reasoning instead, so
            # the constrained answer still follows.
            token = req.params.reasoning_end_token  # type: ignore[assignment]
        req.output_token_ids.append(token)
        if state.constraint is not None and not ends_turn:
            state.constraint.feed(self.tokenizer.token_bytes(token))
        elif req.params.constrained and state.constraint is None and token == req.params.reasoning_end_token:
            state.constraint = output_constraint(req.params)
        if state.reasoning and token in (req.params.reasoning_end_token, self._tool_call_token):
            state.reasoning = False
        held = state.tool_call
        if held is not None and not held.done and not ends_turn and not held.feed(self.tokenizer.token_bytes(token)):
            log.debug("request %s: token %d left its tool call's rules; no longer held", req.request_id, token)
        counted = req.params.in_request_metrics
        if req.first_token_time is None:
            req.first_token_time = now
            if counted:
                with self.metrics.lock:
                    self.metrics.ttft.observe(now - req.arrival_time)
        elif req.last_token_time is not None and counted:
            with self.metrics.lock:
                self.metrics.itl.observe(now - req.last_token_time)
        req.last_token_time = now
        with self.metrics.lock:
            self.metrics.generation_tokens += 1
        new_lp = None
        if lp is not None:
            req.output_logprobs.append(lp)  # offline callers (LLMEngine.generate) read them off the request
            new_lp = [(token, lp[0], lp[1])]
        p = req.params
        is_stop_token = token in p.stop_token_ids or (not p.ignore_eos and token in req.eos_token_ids)
        if is_stop_token and len(req.output_token_ids) >= p.min_tokens:
            return self._finish(req, "stop", token, [token], state.stops.flush(), new_lp)
        delta = ""
        if state.detok is not None:
            delta = state.stops.add(state.detok.add(token))
            if state.stops.stopped is not None:
                return self._finish(req, "stop", state.stops.stopped, [token], delta, new_lp)
        if len(req.output_token_ids) >= p.max_tokens or req.num_tokens >= self.max_model_len:
            if state.detok is not None:
                delta += state.stops.add(state.detok.flush())
                delta += state.stops.flush()
            return self._finish(req, "length", None, [token], delta, new_lp)
        return RequestOutput(
            req.request_id,
            [token],
            delta,
            False,
            num_prompt_tokens=len(req.prompt_token_ids),
            num_output_tokens=len(req.output_token_ids),
            num_cached_tokens=req.cached_prompt_tokens,
            new_logprobs=new_lp,
        )

    def _finish(
        self,
        req: Request,
        reason: str,
        stop_reason: str | int | None,
        new_tokens: list[int],
        delta: str,
        new_lp: list[tuple[int, float, list[tuple[int, float]]]] | None = None,
    ) -> RequestOutput:
        self.scheduler.finish(req)
        req.finish_reason, req.stop_reason = reason, stop_reason
        self.requests.pop(req.request_id, None)
        self.text.pop(req.request_id, None)
        now = time.monotonic()
        if not req.params.in_request_metrics:
            return self._output_of_finished(req, new_tokens, delta, reason, stop_reason, new_lp)
        with self.metrics.lock:
            m = self.metrics
            m.finished[reason] = m.finished.get(reason, 0) + 1
            m.e2e.observe(now - req.arrival_time)
            if req.first_scheduled_time is not None:
                m.queue_time.observe(req.first_scheduled_time - req.arrival_time)
            m.prompt_tokens += len(req.prompt_token_ids)
            m.prompt_len.observe(len(req.prompt_token_ids))
            m.generation_len.observe(len(req.output_token_ids))
        return self._output_of_finished(req, new_tokens, delta, reason, stop_reason, new_lp)

    @staticmethod
    def _output_of_finished(
        req: Request,
        new_tokens: list[int],
        delta: str,
        reason: str,
        stop_reason: str | int | None,
        new_lp: list[tuple[int, float, list[tuple[int, float]]]] | None,
    ) -> RequestOutput:
        return RequestOutput(
            req.request_id,
            new_tokens,
            delta,
            True,
            reason,
            stop_reason,
            len(req.prompt_token_ids),
            len(req.output_token_ids),
            req.cached_prompt_tokens,
            new_lp,
        )

    def _update_gauges(self, stepped: bool = True) -> None:
        with self.metrics.lock:
            m = self.metrics
            m.num_running = len(self.scheduler.running)
            m.num_waiting = len(self.scheduler.waiting)
            m.kv_cache_usage = self.kv.usage(self.plan.full_block_bytes, self.plan.sliding_block_bytes)
            m.num_preemptions = self.scheduler.num_preemptions
            m.num_priority_preemptions = self.scheduler.num_priority_preemptions
            m.prefix_cache_queries = self.kv.prefix_queries
            m.prefix_cache_hits = self.kv.prefix_hits
            m.late_kernel_compiles = LATE_COMPILES.count if self.watches_compiles else 0
            m.decode_steps_ahead = self.steps_ahead
            if stepped:
                m.steps += 1
                m.last_step_time = time.monotonic()

    # ------------------------------------------------------------------ convenience
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Request]:
        """Run prompts to completion (offline use and tests); returns the finished requests in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.add_request(f"offline-{next(_offline_ids)}", p, sp) for p, sp in zip(prompts, plist)]
        while self.has_unfinished():
            self.step()
        return reqs
