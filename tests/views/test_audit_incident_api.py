"""The API's audit event carries ``incident_ref`` (issue 22's stop, item 1): the incident
a reviewer worked on when they caused the event, as the dashboard's audit log shows it,
in the audit list and in a proof's event; null when there was none. The export's lines
are unchanged (the key only when set)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from checkpoints import auditexport, services
from checkpoints.models import AuditEvent
from tests.api.apihelpers import get, url

pytestmark = pytest.mark.django_db


def test_the_api_gives_each_event_its_incident_ref_or_null(login, rita, vic, unknown,
                                                          api_as, acme):
    client = login(rita)
    assert client.post(reverse("incident_set", args=["acme"]),
                       {"incident_ref": "INC-2041"}).status_code == 303
    client.post(reverse("run_retry_request", args=["acme", unknown.run_id]),
                {"reason": "the gateway has no look-up"})
    tagged = AuditEvent.objects.get(action="retry.request")
    assert tagged.incident_ref == "INC-2041"
    services.audit_record(tenant=acme, actor=None, action="test.note",
                          target_type="tenant", target_id="n1")
    plain = AuditEvent.objects.get(action="test.note")

    listed = get(api_as(vic), "acme", "audit-events")
    assert listed.status_code == 200, listed.content
    by_id = {e["id"]: e for e in listed.json()["results"]}
    assert by_id[tagged.pk]["incident_ref"] == "INC-2041"
    assert by_id[plain.pk]["incident_ref"] is None  # the key is always there
    # The search by incident gives the same shape, through the same selector.
    found = get(api_as(vic), "acme", "audit-events", q="inc-20").json()["results"]
    assert [(e["id"], e["incident_ref"]) for e in found] == [(tagged.pk, "INC-2041")]

    services.audit_integrate(acme)
    proof = api_as(vic).get(url("acme", f"audit-events/{tagged.pk}/proof"))
    assert proof.status_code == 200, proof.content
    assert proof.json()["event"] == by_id[tagged.pk]  # the event as the list shows it

    # The export is as it was: the key only on an event that has one.
    assert auditexport.event_line(tagged)["incident_ref"] == "INC-2041"
    assert "incident_ref" not in auditexport.event_line(plain)


def test_the_schema_documents_incident_ref(api_as, vic):
    schema = api_as(vic).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    field = schema.json()["components"]["schemas"]["AuditEvent"]["properties"]["incident_ref"]
    assert field["nullable"] is True and field["type"] == "string"
    assert "INC-2041" in field["description"]
