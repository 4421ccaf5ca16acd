"""The Data page (issue 20): every role of the tenant reads the policy, the tombstones,
the active holds and the erasure requests; only the admin gets the form, and its POST
goes through ``services.data_policy_set``; another tenant's reader gets 404. A deleted
run's page says so and offers no reveal and no action."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from checkpoints import services
from checkpoints.models import AuditEvent, DataPolicy, ErasureRequest, Tombstone
from tests.helpers import age_world

from .retention_world import DAY, completed_run, hold_run, set_policy

pytestmark = pytest.mark.django_db


def as_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


POLICY = {"payload_retention_days": "30", "effect_retention_days": "", "restart_interval_s":
          "86400", "tombstone_retention_days": "", "secrets_policy": "refuse",
          "payload_flag_bytes": "", "subject_fields": "customer = /customer/id\n"}


@pytest.mark.parametrize("who", ["vic", "rita", "april", "wendy", "adam"])
def test_the_page_renders_for_every_role_and_only_the_admin_gets_the_form(request, acme,
                                                                          who):
    page = as_user(request.getfixturevalue(who)).get("/t/acme/data/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="tombstones"' in html and 'id="legal-holds"' in html
    assert ('id="f-data-policy"' in html) == (who == "adam")
    assert 'aria-current="page">Data</a>' in html


def test_another_tenants_reader_gets_404_and_a_parameter_is_checked(acme, omar, vic):
    assert as_user(omar).get("/t/acme/data/").status_code == 404
    assert as_user(omar).post("/t/acme/data/policy/", POLICY).status_code == 404
    assert as_user(vic).get("/t/acme/data/?before=x").status_code == 400
    assert as_user(vic).get("/t/acme/data/?nope=1").status_code == 400


@pytest.mark.parametrize("who, status", [("vic", 403), ("rita", 403), ("april", 403),
                                         ("wendy", 403), ("adam", 303)])
def test_only_the_admin_posts_the_policy(request, acme, who, status):
    answer = as_user(request.getfixturevalue(who)).post("/t/acme/data/policy/", POLICY)
    assert answer.status_code == status
    assert DataPolicy.objects.for_tenant(acme).exists() == (status == 303)


def test_the_form_saves_through_the_service_and_bad_input_names_the_field(acme, adam):
    client = as_user(adam)
    assert client.post("/t/acme/data/policy/", POLICY).status_code == 303
    row = DataPolicy.objects.for_tenant(acme).get()
    assert row.payload_retention_days == 30 and row.effect_retention_days is None
    assert row.subject_fields == {"customer": "/customer/id"}
    assert row.secrets_policy == "refuse"
    events = AuditEvent.objects.for_tenant(acme).filter(action="data_policy.set").count()
    client.post("/t/acme/data/policy/", POLICY)  # the same values: nothing written
    assert AuditEvent.objects.for_tenant(acme).filter(action="data_policy.set").count() == events
    for field, value, named in [("payload_retention_days", "0", "payload_retention_days"),
                                ("effect_retention_days", "0x1", "effect_retention_days"),
                                ("subject_fields", "customer /x", "subject_fields"),
                                ("subject_fields", "c = x", "subject_fields.c"),
                                ("subject_fields", "c = /a\nc = /b", "subject_fields"),
                                ("effect_retention_days", "1", "effect_retention_days")]:
        answer = client.post("/t/acme/data/policy/", {**POLICY, field: value,
                                                      "restart_interval_s": "172800"})
        assert answer.status_code == 400, (field, value)
        assert named + ":" in answer.content.decode()
    assert DataPolicy.objects.for_tenant(acme).get().payload_retention_days == 30


def test_the_page_links_the_approver_to_the_erasure_queue(acme, april, vic):
    """The approver reaches the queue from the Data page (the newcomer found no link)."""
    assert 'href="/t/acme/erasure-requests/">approve or reject' in (
        as_user(april).get("/t/acme/data/").content.decode())
    assert 'href="/t/acme/legal-holds/"' in as_user(vic).get("/t/acme/data/").content.decode()


def test_the_page_lists_tombstones_holds_and_erasures_without_payload_values(
        acme, wendy, adam, rita, vic):
    runs = [completed_run(wendy, acme, order_id=f"SECRET-{i}") for i in range(3)]
    hold_run(adam, acme, runs[2])
    ErasureRequest.objects.create(tenant=acme, uuid=uuid.uuid4(), run_uuids=[str(runs[0].uuid)],
                                  reason="gdpr art. 17", requested_by=rita,
                                  requested_by_name="rita")
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    services.retention_purge(tenant=acme)
    html = as_user(vic).get("/t/acme/data/").content.decode()
    for run in runs[:2]:
        assert str(run.uuid) in html
    assert "case 1" in html and "gdpr art. 17" in html and "SECRET" not in html
    assert "2 in all" in html


def test_tombstones_page_by_keyset(acme, wendy, vic, monkeypatch):
    from checkpoints.selectors import lifecycle  # noqa: PLC0415 - the page size, patched

    monkeypatch.setattr(lifecycle, "TOMBSTONE_PAGE", 2)
    monkeypatch.setattr(lifecycle.tombstone_page, "__kwdefaults__", {"before": None,
                                                                     "limit": 2})
    runs = [completed_run(wendy, acme, order_id=f"P-{i}", effect=False) for i in range(3)]
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    services.retention_purge(tenant=acme)
    ids = list(Tombstone.objects.for_tenant(acme).order_by("-id").values_list("pk", flat=True))
    html = as_user(vic).get("/t/acme/data/").content.decode()
    assert f"?before={ids[1]}" in html and str(runs[0].uuid) not in html
    more = as_user(vic).get(f"/t/acme/data/?before={ids[1]}", HTTP_HX_REQUEST="true")
    assert str(runs[0].uuid) in more.content.decode()
    assert "<h1>" not in more.content.decode()


def test_a_deleted_runs_page_says_so_and_offers_nothing(acme, wendy, adam):
    run = completed_run(wendy, acme)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    services.retention_purge(tenant=acme)
    stone = Tombstone.objects.for_tenant(acme).get()
    html = as_user(adam).get(f"/t/acme/runs/{run.uuid}/").content.decode()
    assert "Payloads deleted by retention on" in html and f"(tombstone #{stone.pk})" in html
    assert "Why reveal?" not in html and "/close/" not in html
    assert "Request erasure" not in html and "No checkpoint yet" not in html
    assert "Place legal hold" in html  # what is left of it may still be held
    listed = as_user(adam).get("/t/acme/?state=all").content.decode()
    assert str(run.uuid)[:8] in listed
