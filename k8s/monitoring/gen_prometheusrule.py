"""Write prometheusrule.yaml (a Prometheus-operator PrometheusRule) from the plain rules file beside it.

    python k8s/monitoring/gen_prometheusrule.py          # rewrite prometheusrule.yaml
    python k8s/monitoring/gen_prometheusrule.py --check  # exit 1 if prometheusrule.yaml is out of date

flint-alerts.rules.yaml is the source (promtool checks and unit-tests it); tests/test_alerts.py runs --check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "flint-alerts.rules.yaml"
OUT = HERE / "prometheusrule.yaml"

HEADER = """\
# GENERATED from flint-alerts.rules.yaml by gen_prometheusrule.py: edit the rules file, then run
#   python k8s/monitoring/gen_prometheusrule.py
# The `release` label must match your Prometheus' ruleSelector (kube-prometheus-stack: the Helm release name).
"""


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL, descriptions), so the output stays readable."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    rules = yaml.safe_load(rules_text)
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "flint-serve-alerts",
            "labels": {"app.kubernetes.io/part-of": "flint-serve", "release": "prometheus"},
        },
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if prometheusrule.yaml is out of date")
    args = parser.parse_args(argv)
    text = render(RULES.read_text())
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
