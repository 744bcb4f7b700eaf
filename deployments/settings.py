"""Settings for the Ray Serve application (what `flint-serve`, `serve run` args and config YAML accept)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flint_engine.api.settings import APISettings
from flint_engine.byte_size import parse_byte_size
from flint_engine.engine_config import EngineConfig


class ServeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # model and engine
    model: str | None = Field(default=None, description="GGUF file or HF directory; None: the embedded default")
    model_name: str = "flint"
    dtype: str = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_num_seqs: int | None = Field(default=None, ge=1, description="default 64 on GPU, 16 on CPU")
    max_num_batched_tokens: int = Field(default=2048, ge=16)
    idle_prefill_tokens: int | None = Field(
        default=None, ge=16, description="tokens of a prefill-only step; default 8192 on the fused GPU path"
    )
    max_model_len: int | None = Field(default=None, ge=16)
    kv_cache_memory: int | None = Field(default=None, ge=1, description="bytes, or a size such as 8GiB")
    gpu_memory_utilization: float = Field(default=0.90, ge=0.05, le=0.99)
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_waiting_requests: int = Field(default=256, ge=1)
    kernels: Literal["auto", "reference", "fast"] = "auto"
    cuda_graphs: bool = True
    step_graphs: bool = Field(default=True, description="prefill and mixed steps on CUDA graphs too")
    prefill_warmup: bool = True
    precompile_kernels: bool = Field(default=True, description="compile the GPU's kernel manifest in parallel at start")
    async_decode: bool = Field(default=True, description="launch a decode step before the last one's tokens are read")

    # replicas and autoscaling (one engine per GPU, TP=1)
    num_replicas: int | None = Field(default=None, ge=1, description="fixed count; disables autoscaling")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int | None = Field(default=None, ge=1, description="default: GPUs in the cluster, or 1 on CPU")
    initial_replicas: int | None = Field(default=None, ge=0)
    target_ongoing_requests: float | None = Field(default=None, gt=0, description="default 0.75 x max_num_seqs")
    max_ongoing_requests: int | None = Field(default=None, ge=1, description="default max_num_seqs + 25%")
    max_queued_requests: int = Field(default=256, ge=1, description="per handle; beyond it requests get 503")
    upscale_delay_s: float = Field(default=30.0, ge=0)
    downscale_delay_s: float = Field(default=300.0, ge=0)
    look_back_period_s: float = Field(default=30.0, gt=0)
    replica_num_cpus: float | None = Field(default=None, gt=0)
    router_replicas: int = Field(default=1, ge=1)
    router_num_cpus: float = Field(default=0.25, gt=0)
    routing: Literal["prefix_affinity", "power_of_two"] = "prefix_affinity"

    # health and shutdown
    health_check_period_s: float = Field(default=10.0, gt=0)
    health_check_timeout_s: float = Field(default=30.0, gt=0)
    wedge_timeout_s: float = Field(default=60.0, gt=0, description="engine loop stuck this long = unhealthy")
    graceful_shutdown_timeout_s: float = Field(default=60.0, ge=0)

    # API
    api: APISettings = Field(default_factory=APISettings)

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _byte_size(cls, v: Any) -> Any:
        return v if v is None else parse_byte_size(v)

    @model_validator(mode="after")
    def _sync(self) -> ServeSettings:
        self.api.model_name = self.model_name
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")
        return self

    def uses_gpu(self) -> bool:
        if self.device == "cuda":
            return True
        if self.device == "cpu":
            return False
        import ray

        return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) >= 1

    def seqs(self, gpu: bool) -> int:
        return self.max_num_seqs or (64 if gpu else 16)

    def engine_config(self, gpu: bool) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            dtype=self.dtype,
            device="cuda" if gpu else "cpu",
            block_size=self.block_size,
            max_num_seqs=self.seqs(gpu),
            max_num_batched_tokens=self.max_num_batched_tokens,
            idle_prefill_tokens=self.idle_prefill_tokens,
            max_model_len=self.max_model_len,
            kv_cache_memory=self.kv_cache_memory,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            max_waiting_requests=self.max_waiting_requests,
            kernels=self.kernels,
            cuda_graphs=self.cuda_graphs,
            step_graphs=self.step_graphs,
            prefill_warmup=self.prefill_warmup,
            precompile_kernels=self.precompile_kernels,
            async_decode=self.async_decode,
        )

    def replica_options(self, gpu: bool) -> dict[str, Any]:
        seqs = self.seqs(gpu)
        max_ongoing = self.max_ongoing_requests or seqs + max(1, seqs // 4)
        actor: dict[str, Any] = {"num_cpus": self.replica_num_cpus or (2 if gpu else 1)}
        if gpu:
            actor["num_gpus"] = 1
        opts: dict[str, Any] = {
            "ray_actor_options": actor,
            "max_ongoing_requests": max_ongoing,
            "max_queued_requests": self.max_queued_requests,
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": 2.0,
        }
        if self.num_replicas is not None:
            opts["num_replicas"] = self.num_replicas
        else:
            max_r = self.max_replicas or self._default_max_replicas(gpu)
            opts["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": max(max_r, self.min_replicas, 1),
                "initial_replicas": self.initial_replicas
                if self.initial_replicas is not None
                else max(self.min_replicas, 1),
                "target_ongoing_requests": self.target_ongoing_requests or max(1.0, 0.75 * seqs),
                # Scale down only after a full averaging window of low load, so bursts do not make replicas flap.
                "upscale_delay_s": max(self.upscale_delay_s, 0.0),
                "downscale_delay_s": max(self.downscale_delay_s, self.look_back_period_s),
                "look_back_period_s": self.look_back_period_s,
            }
        if self.routing == "prefix_affinity":
            opts["request_router_config"] = {
                "request_router_class": "flint_serve.request_router:PrefixAffinityRouter",
                "request_routing_stats_period_s": 5,
            }
        return opts

    @staticmethod
    def _default_max_replicas(gpu: bool) -> int:
        if not gpu:
            return 1
        import ray

        return max(1, int(ray.cluster_resources().get("GPU", 1))) if ray.is_initialized() else 1

    def router_options(self) -> dict[str, Any]:
        return {
            "num_replicas": self.router_replicas,
            "ray_actor_options": {"num_cpus": self.router_num_cpus},
            # The router only forwards; its own queue is bounded by the replicas' max_queued_requests.
            "max_ongoing_requests": 4096,
            "health_check_period_s": self.health_check_period_s,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
        }
