"""Alert rules and the Grafana dashboard under k8s/: promtool checks, unit tests, and a model check.

promtool comes from Debian's `prometheus` package (`apt-get install -y prometheus`); without it the tests that need
it skip locally and fail under CI=true. The queries run against a live Prometheus elsewhere (the dashboard's
queries come from k8s/grafana/queries.py, loaded here the same way).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from conftest import require

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "k8s" / "monitoring"
RULES = MONITORING / "flint-alerts.rules.yaml"
RULE_TESTS = MONITORING / "tests" / "flint-alerts.test.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = ROOT / "k8s" / "grafana" / "flint-dashboard.json"

# Every metric the rules and the dashboard may use, as Prometheus sees them through Ray's metrics port (Ray adds
# `ray_`). The engine's names carry no ':' -- Ray 2.60's exporter drops metric names that contain one.
_FLINT_HISTOGRAMS = [
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
]
KNOWN_METRICS = {
    *(
        f"ray_flint_{n}"
        for n in (
            "num_requests_running",
            "num_requests_waiting",
            "kv_cache_usage_perc",
            "prompt_tokens_total",
            "generation_tokens_total",
            "num_preemptions_total",
            "num_priority_preemptions_total",
            "request_success_total",
            "prefix_cache_queries_total",
            "prefix_cache_hits_total",
            "late_kernel_compiles_total",
            "engine_steps_total",
            "decode_steps_ahead_total",
            "gpu_memory_used_bytes",
            "batches",  # the routers' own (api_metrics)
            "batch_requests_remaining",
            "background_responses_running",
        )
    ),
    *(f"ray_flint_{h}{s}" for h in _FLINT_HISTOGRAMS for s in ("_bucket", "_sum", "_count")),
    "ray_serve_num_http_requests_total",
    "ray_serve_num_http_error_requests_total",
    *(f"ray_serve_http_request_latency_ms{s}" for s in ("_bucket", "_sum", "_count")),
    "ray_serve_deployment_replica_healthy",
    "ray_serve_deployment_status",
    "ray_serve_replica_processing_queries",
    "ray_serve_deployment_queued_queries",
    "ray_serve_deployment_replica_starts_total",
    "ray_serve_autoscaling_target_replicas",  # defined in Ray 2.60's deployment_state.py
}
SEVERITIES = {"critical", "warning"}
REQUIRED_ANNOTATIONS = {"summary", "description", "runbook"}
EXPECTED_ALERTS = {
    "FlintServeNoHealthyReplicas",
    "FlintServeMetricsAbsent",
    "FlintServeReplicaRestarts",
    "FlintServeHigh5xxRate",
    "FlintServeLoadShedding",
    "FlintServeTTFTHigh",
    "FlintServeKVCacheNearFull",
    "FlintServePreemptionsRising",
    "FlintServeKernelCompiledWhileServing",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "promtool is not installed (Debian: apt-get install -y prometheus)")
    return path  # type: ignore[return-value]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def _rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _rules()["groups"] for r in g["rules"] if "alert" in r]


def _queries_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flint_dashboard_queries", ROOT / "k8s" / "grafana" / "queries.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (ours all start with ray_; label values and strings removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    names = set(re.findall(r"(?<![\w:])(ray_[A-Za-z0-9_:]+)", expr))
    # Grouping clauses name labels, not metrics: by (...), on (...), ignoring (...), group_left (...)
    labels: set[str] = set()
    for clause in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in clause.split(",")}
    return names - labels


# --------------------------------------------------------------------------------------------------------------
# alert rules


def test_promtool_check_rules() -> None:
    proc = _run([_promtool(), "check", "rules", str(RULES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests() -> None:
    proc = _run([_promtool(), "test", "rules", str(RULE_TESTS)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheusrule_matches_rules_file() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == _rules()["groups"], "run: python k8s/monitoring/gen_prometheusrule.py"
    proc = _run([sys.executable, str(MONITORING / "gen_prometheusrule.py"), "--check"])
    assert proc.returncode == 0, proc.stderr


def test_alerts_are_complete() -> None:
    alerts = _alerts()
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names)), "duplicate alert names"
    assert set(names) == EXPECTED_ALERTS
    for a in alerts:
        assert a.get("for"), f"{a['alert']}: no `for` (alerts on a single bad scrape)"
        assert a["labels"]["severity"] in SEVERITIES, a["alert"]
        missing = REQUIRED_ANNOTATIONS - set(a.get("annotations", {}))
        assert not missing, f"{a['alert']}: missing annotations {missing}"
        unknown = _metric_names(a["expr"]) - KNOWN_METRICS
        assert not unknown, f"{a['alert']}: unknown metrics {unknown}"
        assert "ray_flint:" not in a["expr"], "Ray 2.60 does not export metric names with ':'"


def test_every_alert_is_unit_tested_both_ways() -> None:
    """Each alert fires on synthetic series in some test case and stays silent in another."""
    fired: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fired >= EXPECTED_ALERTS, f"never shown firing: {EXPECTED_ALERTS - fired}"
    assert silent >= EXPECTED_ALERTS, f"never shown silent: {EXPECTED_ALERTS - silent}"


# --------------------------------------------------------------------------------------------------------------
# the Grafana dashboard


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_model() -> None:
    dash = _dashboard()
    assert dash["schemaVersion"] >= 36
    assert dash.get("uid") and dash.get("title")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("model_name", "replica"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
        assert "label_values(" in json.dumps(variables[name]["query"]), name

    queries = _queries_module()
    panels = list(queries.iter_panels(dash))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    boxes = []
    for p in panels:
        grid = p["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), p["title"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{p['title']}: outside the 24-column grid"
        boxes.append((p["title"], grid))
        if p["type"] == "row":
            continue
        assert p.get("title"), f"panel {p['id']} has no title"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("targets"), f"{p['title']}: no targets"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"{p['title']}: duplicate refIds"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]
    for i, (a, ga) in enumerate(boxes):  # panels do not overlap
        for b, gb in boxes[i + 1 :]:
            overlap_x = ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
            overlap_y = ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]
            assert not (overlap_x and overlap_y), f"panels {a!r} and {b!r} overlap"


def test_dashboard_variables_and_metrics() -> None:
    dash = _dashboard()
    queries = _queries_module()
    defined = set(queries.template_variables(dash)) | {"__rate_interval", "__interval", "__range"}
    exprs = [t["expr"] for p in queries.iter_panels(dash) for t in p.get("targets", [])]
    for expr in exprs:
        used = {a or b for a, b in re.findall(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", expr)}
        assert used <= defined, f"undefined variables {used - defined} in {expr}"
        unknown = _metric_names(expr) - KNOWN_METRICS
        assert not unknown, f"unknown metrics {unknown} in {expr}"
    text = "\n".join(exprs)
    # The panels the dashboard promises, by what they query.
    for needle in (
        "ray_serve_num_http_requests_total",  # request rate
        "sum by (error_code) (rate(ray_serve_num_http_error_requests_total",  # errors by code
        "ray_flint_prompt_tokens_total",  # tokens/s in
        "ray_flint_generation_tokens_total",  # tokens/s out
        "ray_flint_num_requests_running",
        "ray_flint_num_requests_waiting",
        "ray_flint_kv_cache_usage_perc",
        "ray_flint_num_preemptions_total",
        "ray_flint_prefix_cache_hits_total",
        "ray_flint_late_kernel_compiles_total",  # kernels compiled while serving
        "ray_flint_decode_steps_ahead_total",  # the share of steps launched ahead
        "ray_serve_deployment_replica_healthy",  # replicas and their health
        "ray_flint_gpu_memory_used_bytes",  # per-replica GPU memory
    ):
        assert needle in text, f"no panel queries {needle}"
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        for q in ("0.5", "0.9", "0.99"):
            assert f"histogram_quantile({q}, sum by (le) (rate(ray_flint_{hist}_bucket" in text, f"{hist} p{q}"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every panel query (variables substituted) and variable selector is valid PromQL, per promtool."""
    queries = _queries_module()
    exprs = [q.expr for q in queries.extract_queries(DASHBOARD)]
    exprs += list(queries.variable_selectors(DASHBOARD).values())
    assert len(exprs) >= 30
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    proc = _run([_promtool(), "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout + proc.stderr


def test_queries_helper() -> None:
    queries = _queries_module()
    extracted = queries.extract_queries(DASHBOARD, {"model_name": "flint", "replica": "r1", "__rate_interval": "2m"})
    targets = [t for p in queries.iter_panels(_dashboard()) for t in p.get("targets", [])]
    assert len(extracted) == len(targets)
    for q in extracted:
        assert "$" not in q.expr, q.expr
    assert any('model_name=~"flint"' in q.expr and "[2m]" in q.expr for q in extracted)
    with pytest.raises(KeyError):
        queries.substitute("rate(x[$unknown_variable])")
    proc = _run([sys.executable, str(ROOT / "k8s" / "grafana" / "queries.py"), "--json"])
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == len(targets)
