"""The Data page (issue 20): every role of the tenant reads the policy, the tombstones,
the active holds and the erasure requests; only the admin gets the form, and its POST
goes through ``services.data_policy_set``; another tenant's reader gets 404. A deleted
run's page says so and offers no reveal and no action."""

from __future__ import annotations

import html
import json
import uuid

import pytest
from django.test import Client

from checkpoints import services
from checkpoints.models import AuditEvent, DataPolicy, ErasureRequest, Tombstone
from tests.helpers import age_world, form_fields

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


POLICY_URL = "/api/v1/tenants/acme/data-policy"


def _api_put(api_as, user, body):
    return api_as(user).put(POLICY_URL, data=json.dumps(body), content_type="application/json")


def _page_form(client) -> dict:
    """What the Data page's policy form sends when saved as the page shows it."""
    return form_fields(client.get("/t/acme/data/").content.decode(), "f-data-policy")


def test_the_form_sends_back_the_pointers_the_api_stored(api_as, acme, adam):
    """Saving the Data page changing one other field keeps every subject field as the API
    stored it: a space or ``=`` inside a pointer, non-ASCII keys (stop 34's attack)."""
    fields = {"wf": "/workflow", "cust": "/customer id", "odd": "/a=b c/~0~1/é/ü ber"}
    assert _api_put(api_as, adam, {"subject_fields": fields}).status_code == 200
    client = as_user(adam)
    answer = client.post("/t/acme/data/policy/", {**_page_form(client),
                                                  "payload_flag_bytes": "5000"})
    assert answer.status_code == 303, answer.content.decode()[:2000]
    row = DataPolicy.objects.for_tenant(acme).get()
    assert row.subject_fields == fields and row.payload_flag_bytes == 5000
    event = AuditEvent.objects.for_tenant(acme).filter(action="data_policy.set").latest("pk")
    assert event.after["subject_fields"] == event.before["subject_fields"] == fields


#: Pointers the API took before they had to be one printable line without surrounding
#: whitespace (stop 34's attack): the page showed each of them rewritten or turned around, and saved
#: the first as another key or refused every save over the second.
NOT_ONE_LINE = {"cust": "/customer id ", "x": "/a\nb", "bidi": "/\u202e", "tab": "/a\tb",
                "zw": "/a\u200bb", "ls": "/a\u2028b", "nbsp": "/a\u00a0"}


@pytest.mark.parametrize("name, pointer", sorted(NOT_ONE_LINE.items()))
def test_the_api_and_the_page_refuse_a_pointer_that_is_not_one_printable_line(
        api_as, acme, adam, name, pointer):
    answer = _api_put(api_as, adam, {"subject_fields": {"wf": "/workflow", name: pointer}})
    assert answer.status_code == 400, answer.content
    assert answer.json()["detail"].startswith(f"subject_fields.{name}: "), answer.json()
    assert not DataPolicy.objects.for_tenant(acme).exists()
    if "\n" in pointer:
        return  # a form line cannot hold it (typed, it is two lines: the form refuses them)
    page = as_user(adam).post("/t/acme/data/policy/",
                              {**POLICY, "subject_fields": f"{name} = {pointer}"})
    assert page.status_code == 400
    assert f"subject_fields.{name}: " in html.unescape(page.content.decode())
    assert not DataPolicy.objects.for_tenant(acme).exists()


def test_a_pointer_stored_before_the_rule_locks_nothing_and_can_be_fixed(api_as, acme,
                                                                        adam, vic):
    """A policy that holds such pointers (stored before the rule) still saves from the
    page and through the API: each pointer is shown escaped in quotes on one line, comes
    back unchanged, and is judged again only when the admin changes it."""
    set_policy(acme, payload_retention_days=30)
    stored = {"wf": "/workflow", **NOT_ONE_LINE}
    DataPolicy.objects.for_tenant(acme).update(subject_fields=stored)  # as an old release did
    client = as_user(adam)
    form = _page_form(client)
    lines = form["subject_fields"].split("\r\n")
    assert 'x = "/a\\nb"' in lines and 'cust = "/customer id "' in lines
    assert 'bidi = "/\\u202e"' in lines and "wf = /workflow" in lines
    for page in (client.get("/t/acme/data/"), as_user(vic).get("/t/acme/data/")):
        text = page.content.decode()
        assert "\u202e" not in text and "\u2028" not in text and "/a\nb" not in text
    assert 'bidi = &quot;/\\u202e&quot;' in as_user(vic).get("/t/acme/data/").content.decode()
    # Another field saves, from the page and through the API; the pointers stay.
    answer = client.post("/t/acme/data/policy/", {**form, "payload_flag_bytes": "5000"})
    assert answer.status_code == 303, answer.content.decode()[:2000]
    assert DataPolicy.objects.for_tenant(acme).get().subject_fields == stored
    assert _api_put(api_as, adam, {"payload_retention_days": 7}).status_code == 200
    row = DataPolicy.objects.for_tenant(acme).get()
    assert (row.payload_retention_days, row.payload_flag_bytes) == (7, 5000)
    assert row.subject_fields == stored
    # Changing such a pointer is judged: to another bad one refused, to a good one taken.
    bad = "\r\n".join(["x = /a\tc" if li.startswith("x = ") else li for li in lines])
    answer = client.post("/t/acme/data/policy/", {**form, "subject_fields": bad})
    assert answer.status_code == 400 and "subject_fields.x: " in answer.content.decode()
    good = "\r\n".join(["x = /a" if li.startswith("x = ") else li for li in lines])
    assert client.post("/t/acme/data/policy/", {**form, "subject_fields": good}).status_code == 303
    assert DataPolicy.objects.for_tenant(acme).get().subject_fields == stored | {"x": "/a"}
    # A quoted pointer that is no JSON string names the field.
    answer = client.post("/t/acme/data/policy/", {**form, "subject_fields": 'x = "/a'})
    assert answer.status_code == 400 and "subject_fields: " in answer.content.decode()


def test_the_largest_policy_stored_before_the_rule_still_saves_from_the_page(acme, adam):
    """(stop 34's second attack) Sixteen pointers of 512 characters, each shown escaped
    (six characters per control character), made a text the form's 20,000-character limit
    refused: the page could save no other field. The limit holds every line the page
    can show."""
    set_policy(acme, payload_retention_days=30)
    stored = {f"f{i}": "/" + "\x01" * 511 for i in range(16)}
    DataPolicy.objects.for_tenant(acme).update(subject_fields=stored)  # as an old release did
    client = as_user(adam)
    form = _page_form(client)
    assert len(form["subject_fields"]) > 20_000
    answer = client.post("/t/acme/data/policy/", {**form, "payload_flag_bytes": "5000"})
    assert answer.status_code == 303, answer.content.decode()[:2000]
    row = DataPolicy.objects.for_tenant(acme).get()
    assert (row.payload_flag_bytes, row.subject_fields) == (5000, stored)


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
