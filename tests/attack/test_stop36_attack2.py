"""Attack (stop 36, second round, short time box): one input of each fault kind that
applies, aimed only at what changed on main since 2026-12-07 02:05 (the Approvals page's
refusal for a request decided first, ``RevisionNumberField``, the notifications form's
JSON-whitespace strip, ``/api/schema/``'s ``SchemaParams``, ``sql.WriteTransaction.
__exit__``, ``nextstep.words_now`` and ``data-now``, the demo's subject field). A test
marked FINDING failed on the code it was written
against; an unmarked one is a PASS: what was tried and held.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta

import psycopg
import pytest
from django.apps import apps
from django.db import connection
from django.test import Client
from django.utils import timezone

from checkpoints import services, sql
from checkpoints.dbclock import db_now
from checkpoints.demo.worker import OrderShape
from checkpoints.management.commands.demo import DEMO_SUBJECT_FIELDS
from checkpoints.models import MAX_REVISION, AuditEvent, GraphCheckpoint, NotificationEndpoint
from checkpoints.selectors import nextstep
from checkpoints.templatetags.dashboard import when as when_filter
from tests.views.conftest import make_stuck_run

pytestmark = pytest.mark.django_db


def _session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _tables() -> dict:
    """``label: digest of its rows`` for every managed model but sessions (a login and a
    flash message write the session): two equal answers mean nothing was written."""
    out = {}
    for model in sorted(apps.get_models(), key=lambda m: m._meta.label):
        if model._meta.proxy or not model._meta.managed or model._meta.app_label == "sessions":
            continue
        out[model._meta.label] = hashlib.sha256(repr(list(
            model._base_manager.order_by("pk").values_list())).encode()).hexdigest()[:12]
    return out


@pytest.fixture
def world(acme, wendy, rita, april, adam):
    stuck = make_stuck_run(wendy, acme)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id,
                                   reason="try again")
    return {"run_id": str(stuck.run_id), "checkpoint_id": str(stuck.checkpoint_id),
            "retry_id": retry.pk}


# --- kinds 4, 9, 11: the Approvals page's refusal for a request decided first -------------

@pytest.mark.parametrize("hx", [False, True])
def test_kind9_the_approvals_refusal_is_the_queue_with_words_and_varies_on_hx_request(
        world, acme, april, adam, hx):
    """PASS. april approves the retry request; adam (admin) then posts approve for it from
    a page that was open before, with and without ``HX-Request``: 422, the queue page with
    "Not done: already approved by april … ago" (words, no raw ISO time), ``Vary`` naming
    ``HX-Request``, and nothing written (every table but sessions equal)."""
    services.retry_approve(actor=april, tenant=acme, retry_id=world["retry_id"],
                           reason="go")
    session = _session(adam)  # the login writes last_login and axes' log: before the count
    before = _tables()
    headers = {"HTTP_HX_REQUEST": "true"} if hx else {}
    r = session.post(f"/t/acme/approvals/{world['retry_id']}/",
                            {"decision": "approve", "reason": "me too"}, **headers)
    body = r.content.decode()
    assert r.status_code == 422, body[:500]
    refusal = re.search(r'id="refusal">([^<]*)<', body)
    assert refusal, body[:2000]
    assert "already approved by april" in refusal[1] and " ago" in refusal[1], refusal[1]
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", refusal[1]), refusal[1]
    assert "hx-request" in r.get("Vary", "").lower()
    assert _tables() == before


def test_kind4_the_refusal_s_ago_is_the_database_clock_s(world, acme, april, adam,
                                                          monkeypatch):
    """PASS. The process clock a day ahead (``timezone.now`` patched): the refusal's
    "approved by april … ago" is seconds or minutes, never "1 d ago"."""
    services.retry_approve(actor=april, tenant=acme, retry_id=world["retry_id"],
                           reason="go")
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(days=1))
    r = _session(adam).post(f"/t/acme/approvals/{world['retry_id']}/",
                            {"decision": "reject", "reason": "no"})
    refusal = re.search(r'id="refusal">([^<]*)<', r.content.decode())
    assert r.status_code == 422 and refusal
    assert re.search(r"\d+ (s|min) ago", refusal[1]), refusal[1]


def test_kind6_a_superuser_without_a_grant_cannot_decide_a_retry(world, acme):
    """PASS. A staff superuser with no role in acme posts approve for acme's retry
    request: 404, nothing written (CONTRACT.md 4: the flags give nothing in a tenant)."""
    root = services.account_create(username="root", password="x" * 16)
    type(root).objects.filter(pk=root.pk).update(is_staff=True, is_superuser=True)
    root.refresh_from_db()
    session = _session(root)
    before = _tables()
    r = session.post(f"/t/acme/approvals/{world['retry_id']}/",
                            {"decision": "approve", "reason": "root"})
    assert r.status_code == 404
    assert _tables() == before


# --- kind 2: RevisionNumberField at the column's edges ------------------------------------

@pytest.mark.parametrize("typed", [str(MAX_REVISION + 1), "9" * 30, "0" * 5000 + "1",
                                   "-1", "", "1e3", "0x1"])
def test_kind2_a_revision_beyond_the_column_or_not_digits_is_400_naming_it(world, rita,
                                                                           typed):
    """PASS. The reveal and diff forms with a revision past ``MAX_REVISION`` (2^63-1), 30
    nines, 5000 leading zeros (beyond Python's int-string limit), ``-1``, empty, ``1e3``
    and ``0x1``: 400 naming the field, never a 500, nothing audited."""
    session = _session(rita)
    cp = world["checkpoint_id"]
    before = AuditEvent.objects.count()
    reveal = session.post(f"/t/acme/checkpoints/{cp}/reveal/",
                          {"revision": typed, "reason": "look"})
    diff = session.post(f"/t/acme/checkpoints/{cp}/diff/",
                        {"from_rev": typed, "to_rev": "0", "reason": "look"})
    assert (reveal.status_code, diff.status_code) == (400, 400)
    assert "revision" in reveal.content.decode() and "from_rev" in diff.content.decode()
    assert AuditEvent.objects.count() == before


def test_kind2_revision_max_is_a_revision_that_is_not_there(world, rita):
    """PASS. ``revision=MAX_REVISION`` (the column's last value) is read, not refused
    as a number: a 4xx saying the revision is not there (no 500), nothing audited."""
    before = AuditEvent.objects.count()
    r = _session(rita).post(f"/t/acme/checkpoints/{world['checkpoint_id']}/reveal/",
                            {"revision": str(MAX_REVISION), "reason": "look"})
    assert 400 <= r.status_code < 500
    assert AuditEvent.objects.count() == before


# --- kind 1 and 11: the notifications form's JSON-whitespace strip ------------------------

@pytest.mark.parametrize("tail", ["\u00a0", "\x0c", "\u200b", "\ufeff"])
def test_kind11_the_form_stores_no_url_the_api_refuses(acme, adam, api_as, tail):
    """PASS. A URL ending in NBSP, FF, ZWSP or a BOM (none of them JSON's whitespace):
    the API refuses it (400) and so does the admin's form (400, nothing stored)."""
    url = "https://hooks.example.com/x/1" + tail
    api = api_as(adam).post("/api/v1/tenants/acme/notification-endpoints",
                            data=json.dumps({"name": "api hook", "channel": "webhook",
                                             "url": url, "event_types": ["run.needs_review"]}),
                            content_type="application/json")
    form = _session(adam).post("/t/acme/notifications/new/", {
        "name": "form hook", "channel": "webhook", "url": url, "event_types_sent": "1",
        "event_types": ["run.needs_review"]})
    assert (api.status_code, form.status_code) == (400, 400)
    assert NotificationEndpoint.objects.for_tenant(acme).count() == 0


def test_kind1_an_email_pasted_with_a_newline_is_stored_as_the_address(acme, adam):
    """PASS. An address pasted with a tab before and CRLF after (JSON's whitespace only)
    is stored as the bare address the API would store."""
    r = _session(adam).post("/t/acme/notifications/new/", {
        "name": "mail", "channel": "email", "email": "\tops@example.com\r\n",
        "event_types_sent": "1", "event_types": ["run.needs_review"]})
    assert r.status_code in (200, 302, 303), r.content[:500]
    assert [e.email for e in NotificationEndpoint.objects.for_tenant(acme)] == [
        "ops@example.com"]


# --- kinds 3 and 5: GET /api/schema/ ------------------------------------------------------

@pytest.mark.no_schema_check(reason="the schema's own answers are under test")
def test_kind3_the_schema_endpoint_authenticates_before_it_checks_its_query(acme):
    """FINDING. Anonymous ``GET /api/schema/?zz_unknown=1`` answers 400 naming
    ``zz_unknown`` (and tells a stranger which parameters exist), while anonymous
    ``GET /api/v1/tenants/acme/runs?zz_unknown=1`` answers 401: every other API path
    authenticates first (``TenantApi.initial``: "authentication first: 401 before 404",
    then ``tenant()`` validates the parameters). Right: ``SchemaView.initial`` calls
    ``super().initial`` first, then ``params.validate``."""
    anon = Client()
    other = anon.get("/api/v1/tenants/acme/runs?zz_unknown=1")
    schema = anon.get("/api/schema/?zz_unknown=1")
    assert other.status_code == 401
    assert schema.status_code == other.status_code, schema.content[:300]


@pytest.mark.no_schema_check(reason="the schema's own answers are under test")
@pytest.mark.parametrize("query, ctype", [("", "yaml"), ("format=json", "json"),
                                          ("format=yaml", "yaml")])
def test_kind5_the_schema_by_get_and_head_answers_and_writes_nothing(adam, query, ctype):
    """PASS. ``GET`` and ``HEAD /api/schema/`` with no format, ``format=json`` and
    ``format=yaml``: 200 in that format, nothing written."""
    session = _session(adam)
    before = _tables()
    for r in (session.get("/api/schema/?" + query), session.head("/api/schema/?" + query)):
        assert r.status_code == 200, r.status_code
        assert ("json" in r["Content-Type"]) == (ctype == "json"), r["Content-Type"]
    assert _tables() == before


@pytest.mark.no_schema_check(reason="the schema's own answers are under test")
@pytest.mark.parametrize("query, name", [("format=", "format"), ("format=JSON", "format"),
                                         ("format=openapi", "format"),
                                         ("format=json&format=json", "format"),
                                         ("format=json%00", "format")])
def test_kind3_the_schema_s_format_is_refused_outside_its_choices(adam, query, name):
    """PASS. ``format`` empty, upper-case, ``openapi``, repeated, or with a NUL: 400
    ``invalid_payload`` naming ``format``."""
    r = _session(adam).get("/api/schema/?" + query)
    assert r.status_code == 400, (r.status_code, r.content[:200])
    assert r.json()["error"] == "invalid_payload" and name in r.json()["detail"]


# --- kind 4: words_now and data-now -------------------------------------------------------

def test_kind4_ago_and_when_outside_a_request_read_the_database_clock(db, monkeypatch):
    """PASS. Outside a request (a task, a command), the process clock a day ahead:
    ``nextstep.words_now`` is the database's time, ``ago`` of a time 5 s before it says
    seconds, and ``when``'s ``data-now`` is within a minute of the database's time."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(days=1))
    db = db_now()
    assert abs((nextstep.words_now() - db).total_seconds()) < 60
    assert re.fullmatch(r"\d+ s ago", nextstep.ago(db - timedelta(seconds=5))), \
        nextstep.ago(db - timedelta(seconds=5))
    stamp = re.search(r'data-now="([^"]+)"', str(when_filter(db)))[1]
    shown = timezone.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert abs((shown - db).total_seconds()) < 60


# --- kind 1: the demo's declared subject field --------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_kind1_the_demo_subject_field_is_accepted_and_finds_the_demo_orders(acme, version):
    """PASS. ``DEMO_SUBJECT_FIELDS`` passes ``data_policy_set``'s checks, and its pointer
    resolves to the order id on the demo worker's payload in both versions."""
    services.data_policy_set(actor=None, tenant=acme, subject_fields=DEMO_SUBJECT_FIELDS)
    payload = OrderShape(order_id="A-1001", amount_cents=2599, payments_url="http://x",
                         execution_id="e", schema_version=version).initial_payload()
    pointer = DEMO_SUBJECT_FIELDS["order"]
    assert payload[pointer.lstrip("/")] == "A-1001"


# --- kind 2/11: WriteTransaction.__exit__ when the end is interrupted ---------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind11_an_interrupted_commit_leaves_no_transaction_open(monkeypatch):
    """FINDING. ``sql.WriteTransaction.__exit__`` leaves pipeline mode when the pipeline
    refuses its COMMIT (``except Exception as refused``), but a ``BaseException`` raised
    there (``KeyboardInterrupt``; ``SystemExit`` from gunicorn's worker abort) skips
    ``mode.__exit__``; the ``finally`` reads ``transaction_status`` while the pipeline
    still holds the queued ``BEGIN`` (``ACTIVE``, not ``INTRANS``), so it sends no
    ``ROLLBACK``. Measured: afterwards the session is out of pipeline mode but INTRANS
    (``BEGIN`` reached the server, no ``COMMIT``/``ROLLBACK`` ever did): the next
    autocommit statement of that thread runs inside the block's transaction, the state
    the class docstring says is never left. Right: ``except BaseException`` around the
    end (leave the pipeline, then re-raise), or a ``finally`` that exits the pipeline
    before it checks the transaction status."""
    tx = sql.WriteTransaction()
    tx.__enter__()
    raw = connection.connection
    real = raw.execute

    def interrupt_the_end(query, *args, **kwargs):
        if query == "COMMIT" and raw._pipeline is not None:
            raise KeyboardInterrupt
        return real(query, *args, **kwargs)

    monkeypatch.setattr(raw, "execute", interrupt_the_end)
    with sql.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {sql.table(GraphCheckpoint)}")
    try:
        with pytest.raises(KeyboardInterrupt):
            tx.__exit__(None, None, None)
        assert raw._pipeline is None, "the connection was left in pipeline mode"
        assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        if raw._pipeline is not None:  # leave the session usable for the next test
            raw._pipeline.__exit__(None, None, None)
        if raw.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            real("ROLLBACK")
