"""The committed Grafana dashboard is what deploy/monitoring/grafana/dashboard.py builds, and it has, per
service, the panels the deployment promises. (That each expression returns data: test_live_monitoring.)"""

from __future__ import annotations

import importlib.util
import json
import sys

from tests.deploy.tools import DEPLOY, SERVICES

BUILDER = DEPLOY / "monitoring" / "grafana" / "dashboard.py"


def load_builder():
    spec = importlib.util.spec_from_file_location("dashboard", BUILDER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_committed_dashboard_is_up_to_date():
    builder = load_builder()
    assert builder.DASHBOARD.read_text() == builder.render(), f"run: python {BUILDER.relative_to(DEPLOY.parent)}"


def test_every_service_has_the_promised_panels():
    dashboard = json.loads(load_builder().render())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    promised = {"Requests / s", "RPC latency", "Active", "Batch size", "Bandwidth utilisation", "Compute utilisation"}
    rows = [i for i, panel in enumerate(panels) if panel["type"] == "row"] + [len(panels)]
    assert len(rows) - 1 == len(SERVICES)
    for service, start, end in zip(SERVICES, rows, rows[1:], strict=False):
        titles = {panel["title"] for panel in panels[start + 1 : end]}
        assert promised <= titles, (service, promised - titles)
        exprs = " ".join(t["expr"] for panel in panels[start + 1 : end] for t in panel["targets"])
        assert f"voiceagent_{service}_model_read_bytes_total" in exprs
        assert f"voiceagent_{service}_device_peak_flops_per_second" in exprs
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels if p["type"] != "row")
