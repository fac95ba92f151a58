"""promtool checks the compose Prometheus config and the rules, and runs the rules' unit tests."""

from __future__ import annotations

from tests.deploy.tools import DEPLOY, run, tool

PROMETHEUS = DEPLOY / "monitoring" / "prometheus"


def promtool(*args: str) -> str:
    result = run(tool("promtool"), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_config_is_valid_and_loads_its_rules():
    assert "1 rule files found" in promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))


def test_rules_are_valid():
    promtool("check", "rules", str(PROMETHEUS / "rules.yml"))


def test_rules_unit_tests_pass():
    assert "SUCCESS" in promtool("test", "rules", str(PROMETHEUS / "rules.test.yml"))


def test_promtool_rejects_a_broken_expression(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n  - name: x\n    rules:\n      - record: x:y\n        expr: rate(foo[1m]\n")
    result = run(tool("promtool"), "check", "rules", str(rules))
    assert result.returncode == 1 and "unclosed left parenthesis" in (result.stdout + result.stderr)
