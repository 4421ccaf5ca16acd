"""``GET``/``PUT …/data-policy`` (issue 20, item 1; CONTRACT.md 8): a viewer reads, the
admin writes, other roles 403, another tenant 404; bad input 400 naming the field; the
run API of a deleted run says so and refuses writes with 409 ``run_deleted``."""

from __future__ import annotations

import json
import uuid

import pytest

from checkpoints import services
from checkpoints.models import AuditEvent, DataPolicy
from tests.helpers import age_world

from .retention_world import DAY, completed_run, set_policy

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/{}/data-policy"


def put(client, body, slug="acme"):
    return client.put(URL.format(slug), data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("who, read, write", [
    ("vic", 200, 403), ("rita", 200, 403), ("april", 200, 403), ("wendy", 200, 403),
    ("adam", 200, 200), ("omar", 404, 404),
])
def test_the_access_table(request, api_as, acme, globex, who, read, write):
    client = api_as(request.getfixturevalue(who))
    assert client.get(URL.format("acme")).status_code == read
    answer = put(client, {"payload_retention_days": 30})
    assert answer.status_code == write, answer.content
    assert DataPolicy.objects.for_tenant(acme).exists() == (write == 200)


def test_a_viewer_reads_the_defaults_then_what_the_admin_set(api_as, acme, vic, adam):
    body = api_as(vic).get(URL.format("acme")).json()
    assert body["payload_retention_days"] is None and body["updated_at"] is None
    assert body["secrets_policy"] == "warn" and body["changed"] is False
    events = AuditEvent.objects.count()
    assert AuditEvent.objects.count() == events  # a GET writes nothing
    answer = put(api_as(adam), {"payload_retention_days": 30, "effect_retention_days": 60,
                                "subject_fields": {"customer": "/customer/id"}})
    assert answer.status_code == 200 and answer.json()["changed"] is True
    again = put(api_as(adam), {"payload_retention_days": 30})
    assert again.status_code == 200 and again.json()["changed"] is False
    read = api_as(vic).get(URL.format("acme")).json()
    assert read["subject_fields"] == {"customer": "/customer/id"}
    assert read["updated_by"] == "adam" and read["effect_retention_days"] == 60


@pytest.mark.parametrize("body, named", [
    ({"payload_retention_days": 0}, "payload_retention_days"),
    ({"effect_retention_days": 1, "restart_interval_s": DAY * 2}, "effect_retention_days"),
    ({"subject_fields": {"c": "nope"}}, "subject_fields.c"),
    ({"subject_fields": {"c": "/customer id "}}, "subject_fields.c"),  # shown as another key
    ({"subject_fields": {"c": "/a\nb"}}, "subject_fields.c"),  # two lines of the Data page
    ({"subject_fields": {"c": "/\u202e"}}, "subject_fields.c"),  # shown turned around
    ({"secrets_policy": None}, "secrets_policy"),
    ({"actor": 1}, "actor"),
    ({"tenant": "globex"}, "tenant"),
    ({"payload_retention_days": 10**30}, "payload_retention_days"),
])
def test_bad_input_is_a_400_naming_the_field(api_as, acme, adam, body, named):
    answer = put(api_as(adam), body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "invalid_payload"
    assert answer.json()["detail"].startswith(f"{named}:")
    assert not DataPolicy.objects.for_tenant(acme).exists()


def test_a_query_parameter_is_refused(api_as, acme, vic):
    assert api_as(vic).get(URL.format("acme") + "?x=1").status_code == 400


def test_the_run_api_shows_the_tombstone_and_refuses_writes(api_as, acme, wendy, vic):
    run = completed_run(wendy, acme)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    services.retention_purge(tenant=acme)
    detail = api_as(vic).get(f"/api/v1/tenants/acme/runs/{run.uuid}").json()
    assert detail["run"]["payloads_deleted_at"] is not None
    assert detail["tombstone"]["cause"] == "retention" and detail["checkpoints"] == []
    listed = api_as(vic).get("/api/v1/tenants/acme/runs?recovery_state=completed").json()
    assert [r["run_id"] for r in listed["results"]] == [str(run.uuid)]
    writer = api_as(wendy)
    body = {"id": str(uuid.uuid4()), "run_id": str(run.uuid), "revision": 0,
            "kind": "acme.order", "schema_version": 1, "payload": {"phase": "ready"},
            "updated_at_ms": 1}
    answer = writer.put(f"/api/v1/tenants/acme/checkpoints/{body['id']}",
                        data=json.dumps(body), content_type="application/json",
                        HTTP_IF_NONE_MATCH="*")
    assert answer.status_code == 409 and answer.json()["error"] == "run_deleted"
    answer = writer.post(f"/api/v1/tenants/acme/runs/{run.uuid}/lease",
                         data=json.dumps({"owner": "w", "ttl_s": 30}),
                         content_type="application/json")
    assert answer.status_code == 409 and answer.json()["error"] == "run_deleted"
    answer = writer.get(f"/api/v1/tenants/acme/runs/{run.uuid}/resume")
    assert answer.status_code == 409 and answer.json()["error"] == "run_deleted"
