"""Attack (stop 36): one input or more of each fault kind, aimed first at what changed
since 2026-12-03 (the retry-request list, the forms of the data and notifications pages,
the ticking relative times, ``/readyz``'s degraded replica). A test whose docstring
starts "FINDING." failed on the code it was written against (each fixed in stop 36,
its ``xfail(strict)`` mark then removed); "PASS." says what was tried and held.
"""

from __future__ import annotations

import hashlib
import json
import re
import time as _time
import uuid
from datetime import datetime, timedelta

import pytest
from django.apps import apps
from django.db import DatabaseError
from django.test import Client, TestCase
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from checkpoints import replica, services
from checkpoints.dbclock import db_now
from checkpoints.models import (
    AuditEvent,
    LegalHold,
    NotificationEndpoint,
    ReconcileAttempt,
    ReconcileRequest,
    Run,
)
from checkpoints.ops import health
from checkpoints.reconcile import Answer
from tests.api.apihelpers import get, post, put_fx
from tests.conftest import bearer_client
from tests.faults.stubs import broker_at
from tests.helpers import age_world, effect_body, envelope, put_checkpoint
from tests.views.conftest import make_stuck_run
from tests.views.reconcilers import Scripted

pytestmark = pytest.mark.django_db


def _session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _everything() -> str:
    """Every table the project's models hold (sessions and Django's own included), as
    ``label: digest of its rows``: two equal answers mean nothing was written."""
    return repr(sorted(_tables().items()))


def _tables() -> dict:
    out = {}
    for model in sorted(apps.get_models(), key=lambda m: m._meta.label):
        if model._meta.proxy or not model._meta.managed:
            continue
        out[model._meta.label] = hashlib.sha256(repr(list(
            model._base_manager.order_by("pk").values_list())).encode()).hexdigest()[:12]
    return out


# --- a world with one of everything the dashboard's pages show ----------------------------

@pytest.fixture
def world(acme, wendy, rita, april, adam):
    stuck = make_stuck_run(wendy, acme)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id,
                                   reason="try again")
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "pager", "channel": "webhook", "url": "https://hooks.example.com/in/abc",
        "event_types": ["run.needs_review"]})
    return {"slug": "acme", "run_id": str(stuck.run_id),
            "checkpoint_id": str(stuck.checkpoint_id), "effect_id": str(stuck.effect_id),
            "retry_id": retry.pk, "endpoint_id": str(endpoint.uuid),
            "kind": "acme.order", "version": "1"}


def _dashboard_patterns():
    """``(name, pattern)`` of every named dashboard URL (``checkpoints.urls``)."""
    out = []

    def walk(patterns):
        for p in patterns:
            if isinstance(p, URLResolver):
                if p.urlconf_name == "checkpoints.api.urls" or "api" in str(p.pattern):
                    continue
                walk(p.url_patterns)
            elif isinstance(p, URLPattern) and p.name and p.name not in (
                    "login", "logout", "healthz", "readyz", "metrics", "schema", "api-docs",
                    "api-not-found"):
                out.append(p)

    walk(get_resolver().url_patterns)
    return out


def _dashboard_pages(values: dict) -> list[str]:
    """Every dashboard URL whose parameters ``values`` can fill, reversed."""
    urls = []
    for p in _dashboard_patterns():
        names = list(p.pattern.converters) or re.findall(r"<(?:\w+:)?(\w+)>", str(p.pattern))
        if not all(n in values for n in names):
            continue
        try:
            urls.append(reverse(p.name, kwargs={n: values[n] for n in names}))
        except Exception:  # noqa: BLE001 - a pattern these values cannot fill: skipped
            continue
    return sorted(set(urls))


# --- kind 1: outside data passes the API's checks ------------------------------------------

def _deep(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


@pytest.fixture
def scripted(acme):
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="tests.views.reconcilers.Scripted")
    yield Scripted
    Scripted.answers, Scripted.asked = [], []


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_kind1_a_reconciler_receipt_at_the_depth_limit_is_judged_as_the_api_judges_it(
        acme, wendy, rita, api_as, settings, scripted, extra):
    """PASS. A reconciler's receipt nested ``RECOVERY_MAX_JSON_DEPTH - 2 + extra`` deep
    (around the limit, where the API's body adds two levels: body, receipt) and the same
    receipt in an effect body the runtime PUTs: the plugin's answer is stored as found
    exactly when the API takes the receipt, else recorded ``cannot_tell`` and the effect
    stays in doubt (CONTRACT.md 6 "Data from outside services ... obeys the same rules")."""
    receipt = _deep(settings.RECOVERY_MAX_JSON_DEPTH - 2 + extra)
    # The API's judgement of that receipt, in a confirmed effect of another run.
    fx = effect_body(run_id=uuid.uuid4(), operation_key=f"probe-{extra}")
    client = api_as(wendy)
    assert put_fx(client, "acme", fx, create=True).status_code == 201
    assert put_fx(client, "acme", dict(fx, revision=1, state="submitted"),
                  match=0).status_code == 200
    api = put_fx(client, "acme", dict(fx, revision=2, state="confirmed", receipt=receipt),
                 match=1)
    assert api.status_code in (200, 400), api.content
    # The reconciler's judgement of the same receipt.
    stuck = make_stuck_run(wendy, acme)
    Scripted.answers = [Answer.found(receipt, "payments: found")]
    with TestCase.captureOnCommitCallbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=stuck.run_id, reason="ask")
    attempt = ReconcileAttempt.objects.get()
    stored_found = attempt.answer == "found"
    assert stored_found == (api.status_code == 200), (attempt.answer, attempt.detail,
                                                      api.content)


# --- kind 2: every value fits its column before any query ----------------------------------

_HOSTILE_IDS = [str(2**63), "9" * 40, "-1", "x" * 5000]


@pytest.mark.parametrize("value", _HOSTILE_IDS)
def test_kind2_path_ids_beyond_every_column_answer_4xx_everywhere(world, adam, rita,
                                                                 api_as, value):
    """PASS. Every dashboard URL and every API URL with each id in its path replaced by a
    value no column holds (2^63, 40 digits, -1, 5,000 characters), by GET and by POST, as
    the tenant's admin: a 4xx (400/404/405), never a 500 or a DataError, and nothing
    written."""
    session = _session(adam)
    session.get("/healthz")
    api = api_as(adam)
    api.get("/api/v1/tenants/acme/runs")  # the token's "last used" note (once a minute)
    before = _everything()
    bad = []
    values = dict(world)
    for key in ("run_id", "checkpoint_id", "effect_id", "retry_id", "endpoint_id",
                "version"):
        values[key] = value
    for url in _dashboard_pages(values):
        for method in ("get", "post"):
            r = getattr(session, method)(url, {"reason": "r"} if method == "post" else None)
            if r.status_code >= 500:
                bad.append((method, url, r.status_code))
    for rest in ("runs/{v}", "runs/{v}/resume", "runs/{v}/lease", "runs/{v}/close",
                 "runs/{v}/reconcile", "runs/{v}/retry-requests",
                 "runs/{v}/conflicts/acknowledge", "checkpoints/{v}",
                 "checkpoints/{v}/revisions", "effects/{v}", "effects/{v}/mark-unknown",
                 "effects/{v}/reveal-receipt", "retry-requests/{v}",
                 "retry-requests/{v}/approve", "retry-requests/{v}/withdraw",
                 "bulk-actions/{v}", "bulk-actions/{v}/abort", "audit-events/{v}/proof",
                 "kinds/acme.order/versions/{v}", "kinds/acme.order/migrations/{v}",
                 "legal-holds/{v}", "legal-holds/{v}/release", "erasure-requests/{v}",
                 "erasure-requests/{v}/approve", "tombstone-purges/{v}",
                 "tombstone-purges/{v}/approve", "notification-endpoints/{v}",
                 "notification-endpoints/{v}/deliveries",
                 "notification-endpoints/{v}/rotate-secret"):
        url = f"/api/v1/tenants/acme/{rest.format(v=value)}"
        for method in ("get", "post"):
            r = (api.get(url) if method == "get" else
                 api.post(url, data=json.dumps({"reason": "r"}),
                          content_type="application/json"))
            if r.status_code >= 500 or "json" not in r.get("Content-Type", ""):
                bad.append((method, url[:120], r.status_code))
    assert bad == []
    assert _everything() == before


_FORM_FIELDS = ("reason", "revision", "from_rev", "to_rev", "runs", "subject", "scope",
                "incident_ref", "decision", "client_token", "form_token", "filters",
                "action", "name", "url", "email", "kinds", "agents", "services",
                "group_window_s", "quiet_period_s", "payload_retention_days",
                "effect_retention_days", "restart_interval_s", "tombstone_retention_days",
                "payload_flag_bytes", "secrets_policy", "subject_fields", "to_version",
                "retry", "retries", "tenant", "channel")


@pytest.mark.parametrize("value", ["9" * 25, str(2**63), "-" + str(2**31), "y" * 20000])
def test_kind2_every_dashboard_form_field_beyond_its_column_is_a_4xx(world, adam, value):
    """PASS. Every dashboard URL by POST as the tenant's admin, every field any of its
    forms reads set at once to a value past every column (25 digits, 2^63, -2^31 - 1,
    20,000 characters), ``confirm`` ticked: never a 500 (a DataError on PostgreSQL);
    a value a field may hold (25 digits as a reason) is an action done, the rest 4xx."""
    session = _session(adam)
    body = {f: value for f in _FORM_FIELDS} | {"confirm": "on", "event_types_sent": "1"}
    bad = []
    for url in _dashboard_pages(world):
        r = session.post(url, body)
        if r.status_code >= 500:
            bad.append((url, r.status_code))
    assert bad == []


# --- kind 3: query parameters are validated like bodies ------------------------------------

def test_kind3_every_dashboard_page_refuses_a_parameter_it_does_not_take(world, adam):
    """PASS. Every dashboard page (GET) that answers 200 without a query string, asked
    again with ``?zz_unknown=1``: 400 naming ``zz_unknown`` (docs/security/input.md 4,
    ``forms.QueryForm``: "a parameter the page does not take"), never the page as if the
    parameter were not there."""
    session = _session(adam)
    ignored = []
    for url in _dashboard_pages(world):
        if session.get(url).status_code != 200:
            continue
        r = session.get(url + "?zz_unknown=1")
        if r.status_code != 400 or "zz_unknown" not in r.content.decode():
            ignored.append((url, r.status_code))
    assert ignored == []


@pytest.mark.no_schema_check(reason="the schema's own answers are under test")
@pytest.mark.parametrize("query, name", [("zz_unknown=1", "zz_unknown"), ("lang=%00", "lang"),
                                         ("lang=en&lang=de", "lang"),
                                         ("format=bogus", "format")])
def test_kind3_the_schema_endpoint_validates_its_query_like_every_api_path(adam, query, name):
    """FINDING. ``GET /api/schema/`` (``checkpoints/api/schema.py`` ``SchemaView``, a
    drf-spectacular ``SpectacularAPIView``) is the one path under ``/api/`` whose query
    string nobody checks: ``?zz_unknown=1``, ``?lang=%00`` (U+0000) and ``?lang=en&lang=de``
    answer 200 with the schema, as if they were not there, and ``?format=bogus`` answers 404
    ``not_found`` (DRF's unknown format suffix). CONTRACT.md 6 ("... and the same in query
    parameters: 400 ... naming the field") and ``api.params``' rules (a parameter the
    endpoint does not take, one given twice, U+0000: 400) hold for every ``/api/v1/`` view
    (``TenantApi.initial`` -> ``params.validate``) but not here. Right: the view declares
    its parameters (``format``: json or yaml; ``lang``) as a ``Params`` and validates them
    first, 400 ``{"error": "invalid_payload", "detail": "<name>: ..."}``."""
    r = _session(adam).get("/api/schema/?" + query)
    assert r.status_code == 400, (r.status_code, r.get("Content-Type"))
    assert r.json()["error"] == "invalid_payload" and name in r.json()["detail"]


# --- kind 4: time comparisons use the database clock ---------------------------------------

def test_kind4_a_page_s_relative_times_follow_the_database_clock(world, adam, monkeypatch):
    """PASS. The process clock a day ahead (``django.utils.timezone.now`` and
    ``time.time`` patched), the run page and the Approvals page: every ``<time>``'s
    ``data-now`` is the database's time (within a minute of it), never the process's, and
    the words say seconds or minutes ago for what was written seconds ago."""
    real_now, real_time = timezone.now, _time.time
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(days=1))
    monkeypatch.setattr(_time, "time", lambda: real_time() + 86400)
    session = _session(adam)
    for url in (f"/t/acme/runs/{world['run_id']}/", "/t/acme/approvals/"):
        body = session.get(url).content.decode()
        stamps = re.findall(r'data-now="([^"]+)"', body)
        assert stamps, url
        db = db_now()
        for s in stamps:
            shown = datetime.fromisoformat(s.replace("Z", "+00:00"))
            assert abs((shown - db).total_seconds()) < 60, (url, s, db)
        assert " d ago" not in body and "in 1 d" not in body and "in 23 h" not in body, url


# --- kind 5: a GET (or HEAD) writes nothing ------------------------------------------------

def test_kind5_no_get_or_head_of_any_page_writes(world, adam, april, rita, vic, settings):
    """PASS. Every dashboard page, ``/readyz``, ``/healthz``, ``/metrics`` (with its
    token), ``/api/schema/`` and ``/api/docs/``, by GET, HEAD and GET with HX-Request, as
    each role: every row of every table (sessions included) is unchanged."""
    settings.RECOVERY_METRICS_TOKEN = "t" * 32
    urls = _dashboard_pages(world) + ["/readyz", "/healthz", "/api/schema/", "/api/docs/"]
    clients = [_session(u) for u in (adam, april, rita, vic)]
    for c in clients:  # a first request settles what a login itself writes
        c.get("/healthz")
    before = _everything()
    for c in clients:
        for url in urls:
            c.get(url)
            c.head(url)
            c.get(url, HTTP_HX_REQUEST="true")
        c.get("/metrics", HTTP_AUTHORIZATION="Bearer " + "t" * 32)
    assert _everything() == before


# --- kind 6: rights come only from tenant grants -------------------------------------------

def test_kind6_a_superuser_without_a_grant_sees_and_does_nothing(world, acme):
    """PASS. A staff superuser with no role in acme, by session and by bearer token: every
    acme dashboard page and the API's acme reads answer 404 (CONTRACT.md 4: "Django's
    superuser and staff flags give nothing inside a tenant"), an action on acme's run is
    404 and writes nothing, and ``/`` names no tenant of acme's."""
    root = services.account_create(username="root", password="x" * 16)
    type(root).objects.filter(pk=root.pk).update(is_staff=True, is_superuser=True)
    root.refresh_from_db()
    session = _session(root)
    seen = [(u, r.status_code) for u in _dashboard_pages(world) if u != "/"
            and (r := session.get(u)).status_code not in (404, 405)]
    assert seen == []
    api = bearer_client(root)
    for rest in ("runs", f"runs/{world['run_id']}", "retry-requests", "audit-events",
                 "report", "kinds", "data-policy", "notification-endpoints", "effects",
                 f"checkpoints/{world['checkpoint_id']}", "legal-holds", "tombstones"):
        assert get(api, "acme", rest).status_code == 404, rest
    before = _everything()
    assert post(api, "acme", f"runs/{world['run_id']}/close",
                {"reason": "r"}).status_code == 404
    assert post(api, "acme", f"retry-requests/{world['retry_id']}/approve",
                {"reason": "r"}).status_code == 404
    assert _everything() == before
    assert "acme" not in session.get("/").content.decode().lower().replace(
        "recovery", "")


# --- kind 7: background work survives a broker outage --------------------------------------

@pytest.mark.django_db(transaction=True)
def test_kind7_a_dashboard_reconcile_in_a_broker_outage_is_kept_and_run_later(
        acme, wendy, rita, april, adam, scripted):
    """PASS. A reviewer's reconcile from the run page while the broker refuses
    connections: the page answers (no 500) and says it is queued, the request is stored
    ``queued`` with the broker's error visible in the API's run detail, and the next sweep
    with something to run it settles the effect."""
    stuck = make_stuck_run(wendy, acme)
    Scripted.answers = [Answer.found({"charge_id": "ch_1"}, "payments: found")]
    with broker_at("redis://127.0.0.1:1/0"):
        r = _session(rita).post(f"/t/acme/runs/{stuck.run_id}/reconcile/",
                                {"reason": "the worker died"}, follow=True)
        assert r.status_code == 200, r.status_code
        assert "queued" in r.content.decode()
        (stored,) = ReconcileRequest.objects.all()
        assert stored.state == "queued" and "broker" in stored.last_error
        shown = bearer_client(rita).get(
            f"/api/v1/tenants/acme/runs/{stuck.run_id}").json()["reconcile_requests"]
        assert shown and "broker" in shown[0]["last_error"]
    age_world(120)
    services.sweep_stale_runs()
    assert ReconcileRequest.objects.get().state == "done"


# --- kind 8: health checks tell the truth --------------------------------------------------

def test_kind8_a_broken_replica_degrades_and_anything_else_still_fails(monkeypatch, db):
    """PASS. With a replica configured: the replica check failing alone is 200
    ``{"status": "degraded", "degraded": ["replica"]}`` (``health.DEGRADING``), by GET and
    HEAD; the replica failing together with the audit check is 503 ``unavailable`` naming
    both; the replica well and the audit check failing is 503 too."""
    def broken():
        raise DatabaseError("replica gone")

    monkeypatch.setattr(replica, "configured", lambda: True)
    monkeypatch.setattr(replica, "replica_check", broken)
    monkeypatch.setattr(replica, "lag_s", broken)
    client = Client()
    r = client.get("/readyz")
    assert r.status_code == 200, r.content
    assert r.json()["status"] == "degraded" and r.json()["degraded"] == ["replica"]
    assert client.head("/readyz").status_code == 200

    def audit_broken():
        raise RuntimeError("audit chain broken")

    monkeypatch.setattr(services, "audit_health", audit_broken)
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable"
    assert r.json()["checks"]["replica"].startswith("failed")
    assert r.json()["checks"]["audit"].startswith("failed")
    monkeypatch.setattr(replica, "replica_check", lambda: None)
    monkeypatch.setattr(replica, "lag_s", lambda: 0.0)
    assert client.get("/readyz").status_code == 503
    assert health.DEGRADING == frozenset({"replica"})


# --- kind 9: a response that depends on HX-Request says so in Vary -------------------------

def test_kind9_every_dashboard_answer_varies_on_hx_request(world, adam):
    """PASS. Every dashboard page by GET with and without ``HX-Request``, logged in and
    logged out, and by POST (an action) with ``HX-Request``: whenever the two answers
    differ, or for any dashboard answer at all, ``Vary`` names ``HX-Request``."""
    missing = []
    for client in (_session(adam), Client()):
        for url in _dashboard_pages(world):
            for r in (client.get(url), client.get(url, HTTP_HX_REQUEST="true"),
                      client.post(url, {"reason": "r"}, HTTP_HX_REQUEST="true")):
                vary = r.get("Vary", "")
                if "hx-request" not in vary.lower():
                    missing.append((url, r.status_code, vary))
    assert missing == []


# --- kind 10: what the dashboard hides, the API hides --------------------------------------

def test_kind10_the_retry_list_shows_no_request_the_approvals_page_hides(world, acme, april,
                                                                        rita, wendy, api_as):
    """PASS. A retry request whose run completed since (``policy.retry_applies``): the
    Approvals page does not list it, and neither does ``GET …/retry-requests`` (the
    default, ``state=requested``) nor its count; ``state=all`` lists it for both."""
    cp = world["checkpoint_id"]
    done = envelope(cp, world["run_id"], 2, payload={"phase": "completed", "order_id": "A"})
    put_checkpoint(wendy, acme, done, expected=1)
    page = _session(april).get("/t/acme/approvals/").content.decode()
    shown = {int(n) for n in re.findall(r'data-retry="(\d+)"', page)}
    listed = {i["id"] for i in get(api_as(april), "acme", "retry-requests").json()["results"]}
    assert shown == listed
    assert world["retry_id"] not in listed
    every = {i["id"] for i in get(api_as(april), "acme", "retry-requests",
                                  state="all").json()["results"]}
    assert world["retry_id"] in every


# --- kind 11: two code paths for one rule drift --------------------------------------------

@pytest.mark.parametrize("tail", ["\x0b", "\x1c", "\x85", "\u2028", "\u3000"])
def test_kind11_the_notifications_form_takes_a_url_the_api_refuses(acme, adam, api_as, tail):
    """FINDING. ``checkpoints/dashboard/notifications.py`` ``_body``: ``body[target] =
    post.get(target, "").strip()``. ``str.strip()`` drops far more than the spaces a text
    box adds (VT, FS..US, NEL, U+2028, U+3000), so a URL the API refuses with 400 naming
    ``url`` (``POST …/notification-endpoints`` with ``"url": "https://hooks.example.com/
    x<tail>"``) is stored by the admin's form (``POST /t/acme/notifications/new/``): the
    rule has two homes and they disagree. It is the stop-35 hold form's finding again
    (``_hold_scope``: every character but a line break reaches the service as typed), on
    another form. Right: hand the service the field as typed (at most the surrounding
    ASCII spaces a browser could add), so the form answers the API's 400 beside ``url``
    and stores nothing."""
    url = "https://hooks.example.com/x/1" + tail
    api = api_as(adam).post("/api/v1/tenants/acme/notification-endpoints",
                            data=json.dumps({"name": "api hook", "channel": "webhook",
                                             "url": url, "event_types": ["run.needs_review"]}),
                            content_type="application/json")
    assert api.status_code == 400, api.content
    form = _session(adam).post("/t/acme/notifications/new/", {
        "name": "form hook", "channel": "webhook", "url": url, "event_types_sent": "1",
        "event_types": ["run.needs_review"]})
    assert (form.status_code, NotificationEndpoint.objects.for_tenant(acme).count()) == (400, 0)


@pytest.mark.parametrize("typed", ["1_0", "+10", "\u0661\u0660", "\uff11\uff10", "10\u3000"])
def test_kind11_the_notifications_form_reads_numbers_as_the_data_page_does(acme, adam, typed):
    """FINDING. ``checkpoints/dashboard/notifications.py`` ``_number``: ``int(raw.strip())``
    takes ``1_0``, ``+10``, Arabic-Indic ``١٠``, full-width ``１０`` and ``10`` with an
    ideographic space as 10, so ``group_window_s`` typed so is stored (303/200). The same
    typed number on the Data page is ``forms.typed_number`` (ASCII digits, else the text as
    typed for the service to refuse), and the API's parameters refuse it too
    (``api.params.PlainInt``: "``5.0``, ``５``, ``5 ``: 400"; CONTRACT.md 6). Two homes for
    "a number typed in a form", and they disagree. Right: ``_number`` is
    ``typed_number``, so the form answers 400 beside ``group_window_s`` and stores
    nothing."""
    r = _session(adam).post("/t/acme/notifications/new/", {
        "name": "hook", "channel": "webhook", "url": "https://hooks.example.com/x/1",
        "event_types_sent": "1", "event_types": ["run.needs_review"],
        "group_window_s": typed})
    assert (r.status_code, NotificationEndpoint.objects.for_tenant(acme).count()) == (400, 0)


@pytest.mark.parametrize("typed", ["1.0", "+1", " 1", "\u0661", "\uff11"])
def test_kind11_the_reveal_and_diff_forms_read_a_revision_as_every_other_revision_field(
        world, acme, rita, typed):
    """FINDING. ``checkpoints/dashboard/forms.py``: ``RevealForm.revision`` and
    ``DiffForm.from_rev``/``to_rev`` are Django's ``forms.IntegerField``, which takes
    ``1.0``, ``+1``, `` 1``, Arabic-Indic ``١`` and full-width ``１`` as revision 1; the
    payload is decrypted, shown and audited (``payload.reveal``). The same module's
    ``RevisionNumberField`` exists for exactly this ("Django's ``IntegerField`` would take
    ``" 7"``, ``"+7"`` or ``"\u0661"``, and the API's parameters do not"), and CONTRACT.md
    6 refuses a revision that is not an integer ("floats and strings included"). Right:
    the three fields are ``RevisionNumberField(min_value=0, required=...)``, so each
    answers 400 naming the field and reveals, and audits, nothing."""
    session = _session(rita)
    cp = world["checkpoint_id"]
    before = AuditEvent.objects.count()
    reveal = session.post(f"/t/acme/checkpoints/{cp}/reveal/",
                          {"revision": typed, "reason": "look"})
    diff = session.post(f"/t/acme/checkpoints/{cp}/diff/",
                        {"from_rev": "0", "to_rev": typed, "reason": "look"})
    assert (reveal.status_code, diff.status_code) == (400, 400)
    assert "revision" in reveal.content.decode() and "to_rev" in diff.content.decode()
    assert AuditEvent.objects.count() == before



def test_kind10_a_writer_who_logs_in_sees_the_dashboard_as_a_viewer(world, acme, vic):
    """PASS. CONTRACT.md 4: "a writer account that can log in sees the dashboard as a
    viewer would". A writer with a password and the viewer vic, every dashboard page by
    GET: the same status for both, and no page shows the writer a payload or receipt
    the viewer's page hides (the "Reveal" buttons and their answers)."""
    writer = services.account_create(username="walt", password="x" * 16)
    services.role_grant(actor=None, tenant=acme, user=writer, role="writer")
    as_writer, as_viewer = _session(writer), _session(vic)
    differ = []
    for url in _dashboard_pages(world):
        a, b = as_writer.get(url), as_viewer.get(url)
        if a.status_code != b.status_code:
            differ.append((url, a.status_code, b.status_code))
        elif a.status_code == 200:
            reveal_w = a.content.decode().count("/reveal/") + a.content.decode().count(
                "/receipt/")
            reveal_v = b.content.decode().count("/reveal/") + b.content.decode().count(
                "/receipt/")
            if reveal_w != reveal_v:
                differ.append((url, "reveal", reveal_w, reveal_v))
    assert differ == []


def test_kind6_acme_s_admin_names_a_globex_run_in_every_list_of_runs(
        world, acme, globex, adam, wes, api_as):
    """PASS. acme's admin names a globex run (the same UUID shape, a real run of another
    tenant) in every body that takes a list of run ids: ``POST …/legal-holds``, ``POST
    …/erasure-requests``, ``POST …/bulk-actions``, the legal-hold and bulk forms, and
    ``GET …/retry-requests?run=``: globex's run is answered as absent (4xx or a per-run
    "not found"), and nothing is written about it anywhere."""
    body = envelope(payload={"phase": "ready", "order_id": "G-1"})
    put_checkpoint(wes, globex, body)
    other = body["run_id"]
    api = api_as(adam)
    answers = {
        "hold": post(api, "acme", "legal-holds", {"runs": [other], "reason": "r"}),
        "erasure": post(api, "acme", "erasure-requests", {"runs": [other], "reason": "r"}),
        "list": get(api, "acme", "retry-requests", run=other),
    }
    bulk = api.post("/api/v1/tenants/acme/bulk-actions",
                    data=json.dumps({"action": "close", "reason": "r", "runs": [other]}),
                    content_type="application/json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert answers["hold"].status_code in (400, 404), answers["hold"].content
    assert answers["erasure"].status_code in (400, 404), answers["erasure"].content
    assert answers["list"].status_code == 200 and answers["list"].json()["results"] == []
    if bulk.status_code < 300:
        results = json.dumps(bulk.json())
        assert "not_found" in results or "refused" in results, results
    session = _session(adam)
    form = session.post("/t/acme/legal-holds/place/", {"scope": "runs", "runs": other,
                                                       "reason": "r"})
    assert form.status_code in (400, 404), form.status_code
    assert not any(other in h.run_uuids for h in LegalHold.objects.all())
    assert Run.objects.get(uuid=other).recovery_state != "closed"
