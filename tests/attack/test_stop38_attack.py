"""Stop 38's attack, on 0f26dbc..8ca3176: bulk ``end_lease`` with ``lease_owner``
(``services.bulk``, the API's body, the bulk bar), the incident's reason as a suggestion,
``querystring.refusal_words``, ``GET …/retry-requests?run=`` in every state, the API
audit event's ``incident_ref``, notification filters with padded values and lengths from
the model, the bulk filters' lengths, the legal-hold coverage rule in one home
(``selectors.lifecycle``), the incident box's "No incident set".

A finding is ``xfail(strict=True)`` with its reason (it fails today, passes once fixed);
a probe that held is ``test_PASS_…``."""

from __future__ import annotations

import importlib
import uuid

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from checkpoints import auditshape, selectors, services
from checkpoints.api.serializers import bulk as bulk_shapes
from checkpoints.jobs import bulk as bulk_job
from checkpoints.models import AuditEvent, BulkAction, BulkActionItem, LegalHold, Run
from checkpoints.vocab import AuditAction, BulkOutcome, BulkState
from tests.api.apihelpers import get, url
from tests.conftest import bearer_client
from tests.services.test_bulk_end_lease import leased_run
from tests.views.conftest import make_stuck_run

pytestmark = pytest.mark.django_db

BULK = "/api/v1/tenants/acme/bulk-actions"
ON_SQLITE = "sqlite" in settings.DATABASES["default"]["ENGINE"]


def _bulk_api(user, body, tenant="acme"):
    return bearer_client(user).post(f"/api/v1/tenants/{tenant}/bulk-actions",
                                    {"reason": "node 3 terminated", **body}, format="json",
                                    HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))


def _bar(user, **data):
    client = _login(user)
    body = {"action": "end_lease", "reason": "node 3 terminated",
            "client_token": str(uuid.uuid4()), "scope": "selected", "filters": "", **data}
    return client.post("/t/acme/bulk/", body)


@pytest.fixture
def unknown(acme, wendy, rita):
    """A run whose effect a reviewer marked unknown: a retry may be requested."""
    stuck = make_stuck_run(wendy, acme)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="gateway has no lookup")
    return stuck


def _login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _state():
    return (AuditEvent.objects.count(), BulkAction.objects.count(),
            BulkActionItem.objects.count(),
            sorted(Run.objects.values_list("uuid", "fencing_token", "lease_expires_at")))


# ---- kind: outside data as strict as bodies (the bulk bar's owner) ---------------------

# FIXED (was xfail strict): @pytest.mark.xfail(strict=True, reason=(
#     "FINDING: the bulk bar's lease_owner posted twice (lease_owner=worker-7&lease_owner="
#     "worker-8) is read by Django's last-wins QueryDict: the leases of worker-8 end, where "
#     "a JSON body's repeated key and a repeated query parameter are refused; should be a "
#     "400 'lease_owner: given more than once' with nothing written (dashboard.typed.posted, "
#     "as the run page's fencing_token)"))
def test_the_bulk_bar_refuses_an_owner_posted_twice(acme, wendy, rita):
    seven, _ = leased_run(wendy, acme, "worker-7")
    eight, _ = leased_run(wendy, acme, "worker-8")
    before = _state()
    r = _bar(rita, run=[str(seven), str(eight)], lease_owner=["worker-7", "worker-8"])
    assert r.status_code == 400, r.status_code
    assert "lease_owner" in r.content.decode()
    assert _state() == before


def test_PASS_the_api_refuses_a_repeated_lease_owner_key(acme, wendy, rita):
    seven, _ = leased_run(wendy, acme, "worker-7")
    before = _state()
    raw = (f'{{"action": "end_lease", "reason": "r", "runs": ["{seven}"], '
           '"lease_owner": "worker-8", "lease_owner": "worker-7"}')
    r = bearer_client(rita).post(BULK, raw, content_type="application/json",
                                 HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert r.status_code == 400 and "lease_owner" in r.json()["detail"], r.content
    assert _state() == before


@pytest.mark.parametrize("owner", ["worker\u202e7", "worker-7\u200b", "\u3000", "x" * 257])
def test_PASS_the_bar_and_the_api_refuse_the_same_bad_owners(acme, wendy, rita, owner):
    seven, _ = leased_run(wendy, acme, "worker-7")
    before = _state()
    api = _bulk_api(rita, {"action": "end_lease", "runs": [str(seven)], "lease_owner": owner})
    assert api.status_code == 400 and api.json()["detail"].startswith("lease_owner:"), \
        api.content
    bar = _bar(rita, run=[str(seven)], lease_owner=owner)
    assert bar.status_code == 400 and "lease_owner" in bar.content.decode()
    assert _state() == before


# ---- kind: the answer shows what was stored (SQLite's JSON key read) -------------------

# FIXED (was xfail strict): @pytest.mark.xfail(ON_SQLITE, strict=True, reason=(
#     "FINDING (SQLite): bulk_get reads the owner with KeyTransform('lease_owner', "
#     "'selection'), which on SQLite is JSON_EXTRACT's bare text, then json.loads'd by "
#     "JSONField: an owner named '1e3', 'true' or 'null' answers lease_owner '1000.0', "
#     "'True', null (the result page says 'the leases of True only', or nothing): should be "
#     "the owner as sent, as on PostgreSQL"))
@pytest.mark.parametrize("owner", ["1e3", "true", "null", "1.50"])
def test_the_answer_names_the_owner_as_sent(acme, wendy, rita, owner):
    run, _ = leased_run(wendy, acme, owner)
    r = _bulk_api(rita, {"action": "end_lease", "runs": [str(run)], "lease_owner": owner})
    assert r.status_code == 201, r.content
    assert r.json()["results"][0]["outcome"] == "done"
    assert r.json()["lease_owner"] == owner
    again = bearer_client(rita).get(f"{BULK}/{r.json()['id']}")
    assert again.json()["lease_owner"] == owner


# ---- kind: a column's length copied (generated from the model) -------------------------

@pytest.fixture
def widened(monkeypatch):
    def widen(column: str, n: int) -> None:
        monkeypatch.setattr(Run._meta.get_field(column), "max_length", n)
        importlib.reload(bulk_shapes)

    yield widen
    monkeypatch.undo()
    importlib.reload(bulk_shapes)


# FIXED (was xfail strict): @pytest.mark.xfail(strict=True, reason=(
#     "FINDING: bulk end_lease's lease_owner limit is a copied 256 (BulkActionInputSerializer"
#     "'s max_length=256, services.leases.owner_check's len > 256) while the bulk bar's "
#     "field reads Run.lease_owner's max_length: widen the column and the API still refuses "
#     "an owner the column (and the bar) takes; should read Run._meta as filter_limit does"))
def test_a_widened_lease_owner_column_widens_the_bulk_owner(acme, wendy, rita, widened):
    new = Run._meta.get_field("lease_owner").max_length + 44
    widened("lease_owner", new)
    assert bulk_shapes.BulkActionInputSerializer().fields["lease_owner"].max_length == new
    run, _ = leased_run(wendy, acme, "worker-7")
    r = _bulk_api(rita, {"action": "end_lease", "runs": [str(run)], "lease_owner": "o" * new})
    assert r.status_code == 201, r.content  # past the length check: refused lease_held
    assert r.json()["results"][0]["error"] == "lease_held"


@pytest.fixture
def forms_rebuilt(monkeypatch):
    """``rebuild(column, n)``: ``Run.<column>`` as if a migration made it ``n`` long, the
    dashboard's forms module built again under it (and again as it was afterwards)."""
    from checkpoints.dashboard import forms as dashboard_forms

    def rebuild(column: str, n: int):
        monkeypatch.setattr(Run._meta.get_field(column), "max_length", n)
        return importlib.reload(dashboard_forms)

    yield rebuild
    monkeypatch.undo()
    importlib.reload(dashboard_forms)


# FIXED (was xfail strict): @pytest.mark.xfail(strict=True, reason=(
#     "FINDING: the inbox's subject filter (InboxFilterForm.subject = name_filter('agent'): "
#     "the inbox, the bulk bar's 'every run matching') reads Run.agent only, while "
#     "selectors.filter_limit('subject') (GET …/runs?subject=, a bulk body's filters) is "
#     "the longest of Run.agent and Run.workflow: widen workflow alone and the API takes "
#     "a subject the dashboard refuses (a 400 naming subject); should read filter_limit"))
def test_a_widened_workflow_column_widens_the_inbox_subject_too(acme, forms_rebuilt):
    new = Run._meta.get_field("workflow").max_length + 44
    rebuilt = forms_rebuilt("workflow", new)
    assert selectors.filter_limit("subject") == new  # the API's, at call time
    assert rebuilt.InboxFilterForm.base_fields["subject"].max_length == new


def test_PASS_the_generated_table_of_bulk_lengths_is_the_models(acme):
    """Each bulk length the schema states against the model it matches, now."""
    fields = bulk_shapes.BulkFiltersSerializer().fields
    table = {("kind", fields["kind"].max_length): Run._meta.get_field("kind").max_length,
             ("subject", fields["subject"].max_length): max(
                 Run._meta.get_field(c).max_length for c in ("agent", "workflow")),
             ("lease_owner", bulk_shapes.BulkActionInputSerializer().fields[
                 "lease_owner"].max_length): Run._meta.get_field("lease_owner").max_length}
    for (name, stated), column in table.items():
        assert stated == column, name


# ---- kind: rights only from tenant grants ----------------------------------------------

def test_PASS_a_writer_token_a_viewer_and_another_tenant_cannot_end_leases(
        acme, globex, wendy, rita, vic, omar, wes):
    seven, _ = leased_run(wendy, acme, "worker-7")
    before = _state()
    body = {"action": "end_lease", "runs": [str(seven)], "lease_owner": "worker-7"}
    assert _bulk_api(wendy, body).status_code == 403
    assert _bulk_api(vic, body).status_code == 403
    assert _bulk_api(omar, body).status_code in (403, 404)
    assert _bar(vic, run=[str(seven)], lease_owner="worker-7").status_code == 403
    assert _state() == before
    # globex's reviewer names acme's run under globex: not found there, nothing ended.
    r = _bulk_api(omar, body, tenant="globex")
    assert r.status_code == 201, r.content
    assert r.json()["results"][0]["error"] == "not_found"
    assert services.run_facts(Run.objects.get(uuid=seven)).lease_live


# ---- kind: background work stored, retried, visible; audit shape ------------------------

def test_PASS_end_lease_as_a_stored_job_ends_each_owned_lease_with_its_events(
        acme, wendy, rita, monkeypatch):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    monkeypatch.setattr(bulk_job, "BATCH", 2)
    mine = [leased_run(wendy, acme, "worker-7")[0] for _ in range(4)]
    theirs, their_token = leased_run(wendy, acme, "worker-8")
    bulk, created = services.bulk_submit(
        actor=rita, tenant=acme, action="end_lease", reason="node 3", client_token=uuid.uuid4(),
        run_ids=[str(r) for r in [*mine, theirs]], lease_owner="worker-7")
    assert created and bulk.background and bulk.state == BulkState.QUEUED
    assert not BulkActionItem.objects.exists()
    [submit] = AuditEvent.objects.filter(action=AuditAction.BULK_SUBMIT)
    assert submit.after["lease_owner"] == "worker-7" and "run_ids" not in submit.after
    assert bulk_job.execute(bulk.pk)["result"] == "finished"
    bulk.refresh_from_db()
    assert (bulk.state, bulk.done, bulk.refused) == (BulkState.FINISHED, 4, 1)
    revokes = AuditEvent.objects.filter(action=AuditAction.LEASE_REVOKE)
    assert sorted(str(e.run_uuid) for e in revokes) == sorted(str(r) for r in mine)
    for event in [submit, *revokes]:
        keys = auditshape.SHAPES[event.action]
        assert set(event.before or {}) <= keys[0] and set(event.after or {}) <= keys[1]
        assert event.after.get("bulk_id", str(bulk.uuid)) == str(bulk.uuid)
    assert Run.objects.get(uuid=theirs).fencing_token == their_token
    got = selectors.bulk_get(user=rita, tenant=acme, bulk_id=bulk.uuid)
    assert got.lease_owner == "worker-7" and got.refused == 1
    item = BulkActionItem.objects.get(bulk=bulk, run_uuid=theirs)
    assert (item.outcome, item.error) == (BulkOutcome.REFUSED, "lease_held")


# ---- kind: query parameters validated like bodies; a GET that writes -------------------

@pytest.mark.parametrize("params, field", [
    ({"run": "not-a-uuid"}, "run"), ({"state": ""}, "state"), ({"state": "bogus"}, "state"),
])
def test_PASS_retry_requests_run_and_state_are_checked(api_as, acme, april, params, field):
    before = AuditEvent.objects.count()
    r = get(api_as(april), "acme", "retry-requests", **params)
    assert r.status_code == 400 and r.json()["detail"].startswith(f"{field}:"), r.content
    if params.get("state") == "bogus":
        assert "One of:" in r.json()["detail"]
    assert AuditEvent.objects.count() == before


def test_PASS_retry_requests_run_repeated_is_refused(api_as, acme, april):
    r = api_as(april).get(url("acme", "retry-requests") + f"?run={uuid.uuid4()}&run="
                          f"{uuid.uuid4()}")
    assert r.status_code == 400 and r.json()["detail"].startswith("run:"), r.content


def test_PASS_retry_requests_run_of_another_tenant_lists_nothing(api_as, acme, globex, april, rita,
                                                                 omar, unknown):
    services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id, reason="again")
    assert get(api_as(april), "acme", "retry-requests", run=str(unknown.run_id)
               ).json()["results"]
    gabe = services.account_create(username="gabe", password=None, service=True)
    services.role_grant(actor=None, tenant=globex, user=gabe, role="approver")
    there = get(api_as(gabe), "globex", "retry-requests", run=str(unknown.run_id))
    assert there.status_code == 200 and there.json()["results"] == []


# ---- kind: a response that depends on HX-Request has Vary -------------------------------

def test_PASS_the_run_page_with_a_suggested_reason_varies_on_hx(rita, unknown):
    client = _login(rita)
    client.post(reverse("incident_set", args=["acme"]), {"incident_ref": "INC-7"})
    client.post(reverse("run_retry_request", args=["acme", unknown.run_id]),
                {"reason": "gateway down"})
    page = reverse("run_detail", args=["acme", unknown.run_id])
    for extra in ({}, {"HTTP_HX_REQUEST": "true"}):
        r = client.get(page, **extra)
        assert r.status_code == 200
        assert "hx-request" in r.get("Vary", "").lower()
        assert 'list="incident-reasons"' in r.content.decode()


# ---- kind: the hold rule in two directions ---------------------------------------------

def test_PASS_a_released_runs_hold_covers_in_neither_direction(acme, wendy, rita, adam):
    run, _ = leased_run(wendy, acme, None)
    hold = services.legal_hold_place(actor=adam, tenant=acme, runs=[str(run)],
                                     reason="case 1")
    row = Run.objects.get(uuid=run)
    assert list(selectors.covering_holds(row)) == [hold]
    assert Run.objects.filter(selectors.held_runs_q(acme.pk), pk=row.pk).exists()
    services.legal_hold_release(actor=adam, tenant=acme, hold_id=hold.uuid, reason="done")
    assert not selectors.covering_holds(row).exists()
    assert not Run.objects.filter(selectors.held_runs_q(acme.pk), pk=row.pk).exists()
    assert LegalHold.objects.count() == 1

# ---- kind: time on the database clock --------------------------------------------------

def test_PASS_bulk_end_lease_reads_liveness_on_the_database_clock(acme, wendy, rita,
                                                                  monkeypatch):
    """The app server's clock two hours ahead (every lease past its expiry by it): the
    lease is still live by the database's clock, so it is ended, not refused."""
    from datetime import timedelta

    from django.utils import timezone

    run, token = leased_run(wendy, acme, "worker-7")
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(hours=2))
    r = _bulk_api(rita, {"action": "end_lease", "runs": [str(run)], "lease_owner": "worker-7"})
    assert r.status_code == 201, r.content
    assert r.json()["results"][0]["outcome"] == "done", r.json()["results"]
    assert Run.objects.get(uuid=run).fencing_token == token + 1


# ---- kind: nothing half written ---------------------------------------------------------

def test_PASS_a_run_whose_audit_write_fails_keeps_its_lease(acme, wendy, rita, monkeypatch):
    """The lease.revoke event's write fails for one run: that run's token and expiry are
    as they were (rolled back with it), its result ``failed``, the next run ended."""
    first, first_token = leased_run(wendy, acme, "worker-7")
    second, second_token = leased_run(wendy, acme, "worker-7")
    before = Run.objects.get(uuid=first).lease_expires_at
    from checkpoints.services import leases

    real = leases.audit_record
    calls = []

    def failing(**kwargs):
        calls.append(kwargs["target_id"])
        if len(calls) == 1:
            raise RuntimeError("the audit table is gone")
        return real(**kwargs)

    monkeypatch.setattr(leases, "audit_record", failing)
    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="end_lease", reason="r",
                                   client_token=uuid.uuid4(),
                                   run_ids=[str(first), str(second)], lease_owner="worker-7")
    items = {i.run_uuid: i.outcome for i in BulkActionItem.objects.filter(bulk=bulk)}
    assert items == {first: BulkOutcome.FAILED, second: BulkOutcome.DONE}
    row = Run.objects.get(uuid=first)
    assert (row.fencing_token, row.lease_expires_at) == (first_token, before)
    assert Run.objects.get(uuid=second).fencing_token == second_token + 1
    assert list(AuditEvent.objects.filter(action=AuditAction.LEASE_REVOKE)
                .values_list("run_uuid", flat=True)) == [second]


def test_PASS_the_same_token_with_another_owner_is_another_request(acme, wendy, rita):
    run, token = leased_run(wendy, acme, "worker-7")
    key = str(uuid.uuid4())

    def send(owner):
        return bearer_client(rita).post(BULK, {
            "action": "end_lease", "reason": "r", "runs": [str(run)], "lease_owner": owner},
            format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert send("worker-8").json()["results"][0]["error"] == "lease_held"
    again = send("worker-7")
    assert again.status_code in (400, 409) and "client_token" in again.json()["detail"], \
        again.content
    assert Run.objects.get(uuid=run).fencing_token == token


# ---- kind: a 500 anywhere (refused choices name the choices) ----------------------------

@pytest.mark.parametrize("path", [
    "/t/acme/?state=bogus", "/t/acme/?sort=bogus", "/t/acme/report/?range=bogus",
    "/api/v1/tenants/acme/runs?recovery_state=bogus", "/api/v1/tenants/acme/runs?sort=%00",
    "/api/v1/tenants/acme/retry-requests?sort=bogus&run=" + str(uuid.UUID(int=1)),
    "/api/v1/tenants/acme/audit-events?limit=x",
])
def test_PASS_a_refused_choice_is_a_400_naming_it(acme, april, path):
    client = _login(april) if path.startswith("/t/") else bearer_client(april)
    before = AuditEvent.objects.count()
    r = client.get(path)
    assert r.status_code == 400, (path, r.status_code)
    assert AuditEvent.objects.count() == before


# ---- kind: a GET writes nothing ---------------------------------------------------------

def test_PASS_reading_an_end_lease_writes_nothing(acme, wendy, rita, vic):
    run, _ = leased_run(wendy, acme, "worker-7")
    r = _bulk_api(rita, {"action": "end_lease", "runs": [str(run)], "lease_owner": "worker-7"})
    bid = r.json()["id"]
    before = _state()
    viewer = _login(vic)
    for extra in ({}, {"HTTP_HX_REQUEST": "true"}):
        page = viewer.get(f"/t/acme/bulk/{bid}/", **extra)
        assert page.status_code == 200 and "worker-7" in page.content.decode()
        assert "hx-request" in page.get("Vary", "").lower()
    assert bearer_client(vic).get(f"{BULK}/{bid}").json()["lease_owner"] == "worker-7"
    assert get(bearer_client(rita), "acme", "audit-events").status_code == 200
    assert _state() == before


# ---- kind: outside data (the notifications form) as the API body -----------------------

def test_PASS_the_form_and_the_api_store_the_same_padded_filters(acme, adam):
    """A filter typed in the form (CRLF lines, spaces kept) is stored as the same list
    sent as a body; a kind of spaces is refused by both, naming kinds."""
    from checkpoints.models import NotificationEndpoint

    body = {"name": "n", "channel": "webhook", "url": "https://hooks.example.com/x",
            "event_types": ["run.needs_review"]}
    api = bearer_client(adam).post(url("acme", "notification-endpoints"),
                                   {**body, "name": "api", "agents": ["refund ", "  "]},
                                   format="json")
    assert api.status_code == 201, api.content
    form = _login(adam).post("/t/acme/notifications/new/", {
        **body, "name": "form", "agents": "refund \r\n  \r\n"})
    assert form.status_code in (200, 303), form.content[:300]
    stored = dict(NotificationEndpoint.objects.values_list("name", "agents"))
    assert stored["form"] == stored["api"] == ["refund ", "  "]
    bad_api = bearer_client(adam).post(url("acme", "notification-endpoints"),
                                       {**body, "name": "x", "kinds": ["  "]}, format="json")
    bad_form = _login(adam).post("/t/acme/notifications/new/", {**body, "name": "y",
                                                             "kinds": "  \r\n"})
    assert bad_api.status_code == bad_form.status_code == 400
    assert bad_api.json()["detail"].startswith("kinds:")
    assert NotificationEndpoint.objects.count() == 2


# ---- kind: audit events missing a value (a stored job's events and the incident) ---------

# FIXED (was xfail strict): @pytest.mark.xfail(strict=True, reason=(
#     "FINDING: a reviewer on INC-2041 ends an owner's leases from the bulk bar; inline "
#     "(<= BULK_MAX_RUNS) each lease.revoke event carries incident_ref INC-2041, as a stored "
#     "job (more runs) only the bulk.submit does: its lease.revoke events are null, so "
#     "GET …/audit-events?q=INC-2041 finds the request but none of the leases it ended; "
#     "should carry the request's incident (stored with the job) whichever the size"))
def test_a_stored_jobs_events_carry_the_requests_incident(acme, wendy, rita, monkeypatch):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 1)
    monkeypatch.setattr(bulk_job, "BATCH", 2)
    runs = [leased_run(wendy, acme, "worker-7")[0] for _ in range(2)]
    client = _login(rita)
    client.post(reverse("incident_set", args=["acme"]), {"incident_ref": "INC-2041"})
    r = client.post("/t/acme/bulk/", {
        "action": "end_lease", "reason": "node 3 terminated", "lease_owner": "worker-7",
        "client_token": str(uuid.uuid4()), "scope": "selected", "filters": "",
        "run": [str(x) for x in runs]})
    assert r.status_code == 303, r.content[:300]
    bulk = BulkAction.objects.get()
    assert bulk.background
    assert AuditEvent.objects.get(action=AuditAction.BULK_SUBMIT).incident_ref == "INC-2041"
    assert bulk_job.execute(bulk.pk)["result"] == "finished"
    refs = list(AuditEvent.objects.filter(action=AuditAction.LEASE_REVOKE)
                .values_list("incident_ref", flat=True))
    assert refs == ["INC-2041", "INC-2041"]


def test_PASS_inline_the_bars_events_carry_the_incident(acme, wendy, rita):
    runs = [leased_run(wendy, acme, "worker-7")[0] for _ in range(2)]
    client = _login(rita)
    client.post(reverse("incident_set", args=["acme"]), {"incident_ref": "INC-2041"})
    r = client.post("/t/acme/bulk/", {
        "action": "end_lease", "reason": "node 3 terminated", "lease_owner": "worker-7",
        "client_token": str(uuid.uuid4()), "scope": "selected", "filters": "",
        "run": [str(x) for x in runs]})
    assert r.status_code == 303
    refs = set(AuditEvent.objects.filter(action__in=[AuditAction.LEASE_REVOKE,
                                                     AuditAction.BULK_SUBMIT])
               .values_list("incident_ref", flat=True))
    assert refs == {"INC-2041"}
    found = get(bearer_client(rita), "acme", "audit-events", q="INC-2041").json()["results"]
    assert len(found) >= 3
