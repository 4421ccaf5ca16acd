"""``GET …/tombstones`` and ``…/tombstone-purges`` (issue 20, item 5): the purge's four
eyes over HTTP, its refusals as 409 ``purge_refused`` with the rule, bad input as 400."""

from __future__ import annotations

import uuid

import pytest

from checkpoints import services
from checkpoints.models import AuditEvent, Tombstone, TombstonePurge
from tests.api.apihelpers import post, url
from tests.helpers import age_world
from tests.lifecycle.governance import DAY, hold, keep_tombstones, purged_runs

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready(acme, wendy, tmp_path):
    stones = purged_runs(wendy, acme, 3)
    keep_tombstones(acme, 30)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "export")
    age_world(31 * DAY)
    return stones


def test_tombstones_page_by_cursor(api_as, vic, ready):
    client = api_as(vic)
    r = client.get(url("acme", "tombstones?limit=2"))
    assert r.status_code == 200
    body = r.json()
    assert [t["id"] for t in body["results"]] == [ready[0].pk, ready[1].pk]
    assert body["results"][0]["run_id"] == str(ready[0].run_uuid)
    assert body["results"][0]["cause"] == "retention" and body["next"]
    rest = client.get(body["next"]).json()
    assert [t["id"] for t in rest["results"]] == [ready[2].pk] and rest["next"] is None
    for bad in ("after=x", "after=-1", "limit=0", "limit=501", "cursor=1"):
        r = client.get(url("acme", f"tombstones?{bad}"))
        assert r.status_code == 400 and r.json()["error"] == "invalid_payload", bad


def test_a_purge_over_http(api_as, adam, april, vic, ready):
    r = post(api_as(vic), "acme", "tombstone-purges")
    assert r.status_code == 403
    r = post(api_as(adam), "acme", "tombstone-purges")
    assert r.status_code == 201, r.json()
    purge = r.json()
    assert (purge["state"], purge["tombstone_count"], purge["prepared_by"]) == (
        "prepared", 3, "adam")
    pid = purge["id"]
    assert post(api_as(adam), "acme", f"tombstone-purges/{pid}/approve").status_code == 403
    assert post(api_as(april), "acme", f"tombstone-purges/{pid}/execute").status_code == 403
    r = post(api_as(adam), "acme", f"tombstone-purges/{pid}/execute")
    assert r.status_code == 409 and r.json()["reason"] == "state"
    r = post(api_as(april), "acme", f"tombstone-purges/{pid}/approve")
    assert r.status_code == 200 and r.json()["approved_by"] == "april"
    r = post(api_as(adam), "acme", f"tombstone-purges/{pid}/execute")
    assert r.status_code == 200, r.json()
    assert r.json()["state"] == "executed" and r.json()["executed_by"] == "adam"
    assert not Tombstone.objects.for_tenant(ready[0].tenant_id).exists()
    listed = api_as(vic).get(url("acme", "tombstone-purges")).json()["results"]
    assert [p["id"] for p in listed] == [pid]
    assert api_as(vic).get(url("acme", f"tombstone-purges/{pid}")).json()["state"] == \
        "executed"


def test_refusals_and_bad_input(api_as, acme, adam, april, ready):
    hold(acme, adam, whole=True)
    r = post(api_as(adam), "acme", "tombstone-purges")
    assert r.status_code == 409
    assert r.json()["error"] == "purge_refused" and r.json()["reason"] == "legal_hold"
    assert not TombstonePurge.objects.exists()
    r = post(api_as(adam), "acme", "tombstone-purges", {"all": True})
    assert r.status_code == 400 and "all" in r.json()["detail"]
    missing = uuid.uuid4()
    for rest in (f"tombstone-purges/{missing}", "tombstone-purges/nope"):
        assert api_as(adam).get(url("acme", rest)).status_code == 404
    assert post(api_as(april), "acme", f"tombstone-purges/{missing}/approve").status_code == 404
    r = post(api_as(april), "acme", f"tombstone-purges/{missing}/reject", {})
    assert r.status_code == 400 and r.json()["error"] == "reason_required"


def test_a_get_writes_nothing(api_as, vic, ready):
    n = AuditEvent.objects.count()
    api_as(vic).get(url("acme", "tombstones"))
    api_as(vic).get(url("acme", "tombstone-purges"))
    assert AuditEvent.objects.count() == n
