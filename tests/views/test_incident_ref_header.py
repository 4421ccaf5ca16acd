"""The incident reference from an API client (the newcomer's finding: it lived only in a
dashboard session, so ``curl`` with a token could not tag its events). An optional
``Incident-Ref`` header on every API write: each audit event the request causes carries
it (``audit.working_on``), checked by the dashboard's rule (``audit.incident_ref_checked``,
``IncidentForm``): a bad one is a 400 naming the header with nothing written, on every
method (a GET may reveal a payload: an audited read); the schema documents it."""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent
from tests.api.apihelpers import snapshot, url

pytestmark = pytest.mark.django_db


def _post(client, rest, ref=None, reason="INC-2041: charge timed out"):
    headers = {} if ref is None else {"HTTP_INCIDENT_REF": ref}
    return client.post(url("acme", rest), data={"reason": reason},
                       content_type="application/json", **headers)


def test_every_event_of_a_write_carries_its_incident_ref(api_as, rita, stuck):
    client = api_as(rita)
    r = _post(client, f"effects/{stuck.effect_id}/mark-unknown", "  INC-2041 ")
    assert r.status_code == 200, r.content
    r = _post(client, f"runs/{stuck.run_id}/retry-requests", "INC-2041")
    assert r.status_code == 201, r.content
    events = AuditEvent.objects.filter(actor=rita)
    assert {e.action for e in events} >= {"effect.mark_unknown", "retry.request"}
    assert {e.incident_ref for e in events} == {"INC-2041"}
    # the next request without the header is not tagged: the incident ends with its request
    retry_id = r.json()["id"]
    r = _post(client, f"retry-requests/{retry_id}/withdraw", None)
    assert r.status_code == 200, r.content
    assert AuditEvent.objects.get(action="retry.withdraw").incident_ref is None


@pytest.mark.parametrize("ref, words", [
    ("INC-" + "9" * 61, "Incident-Ref: at most 64 characters"),
    ("INC-2041\x7f", "Incident-Ref: no control characters"),
    ("INC\x1b[31m", "Incident-Ref: no control characters"),
])
def test_a_bad_incident_ref_is_a_400_naming_the_header_and_nothing_is_written(
        api_as, rita, stuck, ref, words):
    before, events = snapshot(), AuditEvent.objects.count()
    r = _post(api_as(rita), f"effects/{stuck.effect_id}/mark-unknown", ref)
    assert r.status_code == 400, r.content
    assert r.json() == {"error": "invalid_payload", "detail": words}
    assert snapshot() == before and AuditEvent.objects.count() == events


def test_an_empty_header_is_no_incident(api_as, rita, stuck):
    r = _post(api_as(rita), f"effects/{stuck.effect_id}/mark-unknown", "  ")
    assert r.status_code == 200, r.content
    assert AuditEvent.objects.get(action="effect.mark_unknown").incident_ref is None


def test_a_get_checks_it_too_and_writes_nothing(api_as, rita, stuck):
    # A GET may record events (a payload's reveal): the header is checked and applied
    # on every method (the stop-38 attack: an API reveal was untagged).
    events = AuditEvent.objects.count()
    r = api_as(rita).get(url("acme", f"runs/{stuck.run_id}"), HTTP_INCIDENT_REF="INC\x7f")
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith("Incident-Ref:")
    assert AuditEvent.objects.count() == events
    r = api_as(rita).get(url("acme", f"runs/{stuck.run_id}"), HTTP_INCIDENT_REF="INC-2041")
    assert r.status_code == 200, r.content
    assert AuditEvent.objects.count() == events


def test_the_schema_documents_the_header_on_every_tenant_operation(api_as, vic):
    schema = api_as(vic).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    seen = 0
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "patch", "delete"):
                continue
            if path.startswith("/api/v1/tenants/"):
                names = {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}
                seen += 1
                assert "Incident-Ref" in names, (method, path)
    assert seen > 40


def _as_wsgi(text: str) -> str:
    """A header's value as a WSGI server gives it: its UTF-8 bytes read as ISO-8859-1."""
    return text.encode().decode("latin-1")


def test_a_utf8_incident_ref_is_kept_as_sent_and_found(api_as, rita, stuck):
    # The stop-38 newcomer: INC-2041-é was stored as INC-2041-Ã© (a second spelling of
    # the incident the dashboard's box stores as typed), and q=INC-2041-é found nothing.
    client = api_as(rita)
    r = _post(client, f"effects/{stuck.effect_id}/mark-unknown", _as_wsgi("INC-2041-é"))
    assert r.status_code == 200, r.content
    assert AuditEvent.objects.get(action="effect.mark_unknown").incident_ref == "INC-2041-é"
    found = client.get(url("acme", "audit-events"), {"q": "INC-2041-é"}).json()["results"]
    assert [e["action"] for e in found] == ["effect.mark_unknown"]


def test_an_incident_ref_whose_bytes_are_not_utf8_is_a_400(api_as, rita, stuck):
    before = snapshot()
    r = _post(api_as(rita), f"effects/{stuck.effect_id}/mark-unknown", "INC-\xe9")
    assert r.status_code == 400, r.content
    assert r.json() == {"error": "invalid_payload", "detail": "Incident-Ref: not UTF-8"}
    assert snapshot() == before
