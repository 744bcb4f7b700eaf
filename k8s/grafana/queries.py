"""Every PromQL query of the Flint Serve Grafana dashboard, with Grafana's variables filled in.

For tests and for checking a live Prometheus (standard library only):

    python k8s/grafana/queries.py                                  # list the queries, one per line
    python k8s/grafana/queries.py --json                           # as JSON (panel, refId, expr)
    python k8s/grafana/queries.py --set model_name=flint --prometheus http://localhost:9090
        # run each query against Prometheus; exit 1 if one fails or (with --require-data) returns nothing

From Python (tests load this file with importlib; k8s/ is not a package):

    queries = extract_queries()                      # list[Query], template variables -> ".*", $__rate_interval -> 1m
    queries = extract_queries(values={"model_name": "flint", "__rate_interval": "2m"})
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent / "flint-dashboard.json"

# Grafana's built-in interval variables, and "match everything" for the dashboard's own template variables.
DEFAULTS: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "namespace": ".*",
    "model_name": ".*",
    "replica": ".*",
}

# $name, ${name} and ${name:format}; Grafana's [[name]] form is not used in this dashboard.
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$", re.S)


@dataclass(frozen=True)
class Query:
    panel_id: int
    panel: str
    ref_id: str
    expr: str


def load_dashboard(path: str | Path = DASHBOARD) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def template_variables(dashboard: Mapping[str, Any]) -> list[str]:
    return [v["name"] for v in dashboard.get("templating", {}).get("list", [])]


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """Replace Grafana variables; unknown ones are an error (a query that cannot run as written)."""
    merged = {**DEFAULTS, **(values or {})}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in merged:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return merged[name]

    return _VARIABLE.sub(repl, expr)


def extract_queries(path: str | Path = DASHBOARD, values: Mapping[str, str] | None = None) -> list[Query]:
    """The PromQL of every panel target, variables substituted, in dashboard order."""
    dashboard = load_dashboard(path)
    out = []
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            if expr.strip():
                title, ref_id = panel.get("title", ""), target.get("refId", "")
                out.append(Query(panel["id"], title, ref_id, substitute(expr, values)))
    return out


def variable_selectors(path: str | Path = DASHBOARD, values: Mapping[str, str] | None = None) -> dict[str, str]:
    """For each `label_values(selector, label)` template variable: the selector, as a runnable query."""
    out = {}
    for var in load_dashboard(path).get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        m = _LABEL_VALUES.match(query or "") if var.get("type") == "query" else None
        if m:
            out[var["name"]] = substitute(m.group(1), values)
    return out


def run_query(prometheus: str, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Evaluate one instant query; raises RuntimeError with Prometheus' message when it is rejected."""
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as e:  # 400 for a bad query, with a JSON error body
        body = json.load(e)
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List (or run) the Flint Serve dashboard's PromQL queries.")
    parser.add_argument("--dashboard", default=str(DASHBOARD))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a variable's value")
    parser.add_argument("--json", action="store_true", help="print the queries as JSON")
    parser.add_argument("--prometheus", metavar="URL", help="run every query against this Prometheus")
    parser.add_argument("--require-data", action="store_true", help="with --prometheus: empty results fail too")
    args = parser.parse_args(argv)
    values = dict(item.split("=", 1) for item in args.set)
    queries = extract_queries(args.dashboard, values)

    if not args.prometheus:
        if args.json:
            print(json.dumps([asdict(q) for q in queries], indent=2))
        else:
            for q in queries:
                print(f"[{q.panel} {q.ref_id}] {q.expr}")
        return 0

    failed = 0
    for q in queries:
        try:
            result = run_query(args.prometheus, q.expr)
        except Exception as e:  # report every query, then exit non-zero
            failed += 1
            print(f"FAIL  [{q.panel} {q.ref_id}] {e}\n      {q.expr}")
            continue
        if not result and args.require_data:
            failed += 1
            print(f"EMPTY [{q.panel} {q.ref_id}] {q.expr}")
        else:
            print(f"ok    [{q.panel} {q.ref_id}] {len(result)} series")
    print(f"{len(queries) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
