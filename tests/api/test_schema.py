"""The OpenAPI schema at /api/schema/ (CONTRACT.md section 3) generates cleanly."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator

CONTRACT_PATHS = {
    "checkpoints/{checkpoint_id}": {"get", "put"},
    "checkpoints/{checkpoint_id}/revisions": {"get"},
    "effects": {"get"},
    "effects/{effect_id}": {"get", "put"},
    "effects/{effect_id}/mark-unknown": {"post"},
    # Not in CONTRACT.md: receipts are treated like payloads, so roles that may reveal
    # read one through this audited reveal (issue 6).
    "effects/{effect_id}/reveal-receipt": {"post"},
    "runs": {"get"},
    "runs/{run_id}": {"get"},
    "runs/{run_id}/lease": {"post"},
    "runs/{run_id}/resume": {"get", "post"},
    "runs/{run_id}/close": {"post"},
    "runs/{run_id}/retry-requests": {"post"},
    "runs/{run_id}/reconcile": {"post"},
    "runs/{run_id}/conflicts/acknowledge": {"post"},
    "retry-requests/{retry_id}/approve": {"post"},
    "retry-requests/{retry_id}/reject": {"post"},
    "audit-events": {"get"},
    "report": {"get"},
}


def test_it_serves_the_schema(client, vic):
    client.force_login(vic)  # the schema needs an account (tests/api/test_hardening.py)
    r = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    assert "/api/v1/tenants/{tenant}/checkpoints/{checkpoint_id}" in r.json()["paths"]


def test_it_documents_every_contract_path_and_method():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    prefix = "/api/v1/tenants/{tenant}/"
    paths = {p[len(prefix):]: {m for m in ops if m != "parameters"}
             for p, ops in schema["paths"].items() if p.startswith(prefix)}
    assert paths == CONTRACT_PATHS
    put = schema["paths"][prefix + "checkpoints/{checkpoint_id}"]["put"]
    assert {"200", "201", "400", "404", "409", "412", "413", "428"} <= set(put["responses"])


def test_it_generates_without_warnings_and_validates(tmp_path):
    """``--fail-on-warn`` raises on any generator warning; ``--validate`` checks OpenAPI 3."""
    try:
        call_command("spectacular", "--fail-on-warn", "--validate",
                     "--file", str(tmp_path / "schema.yaml"))
    except Exception as exc:  # noqa: BLE001 - report the generator's complaint
        pytest.fail(f"schema generation warned or failed: {exc}")
