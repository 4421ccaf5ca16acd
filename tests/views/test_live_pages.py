"""Pages that move by themselves (issue 21, item 8): the run page's poll, the inbox's
"n new runs · show" and its one consistent read, the bulk result filling in. Each poll's
queries are pinned (``POLL_QUERIES``: the lead's note asks for "queries per live refresh
of each page"), constant whatever the number of runs, and a poll writes nothing."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints import selectors, services
from checkpoints.dbclock import db_now
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, ReconcileRequest, Run
from checkpoints.reconcile import Answer
from checkpoints.services import reconcile_requests
from checkpoints.vocab import RecoveryState
from tests.helpers import ambiguous_run, envelope, put_checkpoint, sweep_later
from tests.views.conftest import make_stuck_run

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}

#: Queries per live refresh, measured on both backends (a session's user and the
#: tenant's grants included): the run page's poll when nothing changed (the 204), the
#: inbox's "n new runs", the bulk result's table fragment.
POLL_QUERIES = {"run_live_unchanged": 4, "run_new": 4, "bulk_live": 8}


def _count(fetch):
    with CaptureQueriesContext(connection) as ctx:
        response = fetch()
    return response, len(ctx.captured_queries)


def _marker(body: str) -> str:
    return re.search(r"\?seen=([0-9a-f]{12})", body)[1]


def _resume_and_complete(wendy, acme, stuck):
    token = services.resume_claim(actor=wendy, tenant=acme, run_id=stuck.run_id,
                                  asked={})["fencing_token"]
    put_checkpoint(wendy, acme, envelope(stuck.checkpoint_id, stuck.run_id, 2, payload={
        "phase": "completed", "order_id": "A-1042", "amount_cents": 2599}),
        expected=1, token=token)


def test_the_run_page_polls_while_a_retry_waits_and_stops_once_the_run_completed(
        login, acme, rita, april, wendy, unknown):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                   reason="charge unconfirmed")
    client = login(rita)
    page = client.get(reverse("run_detail", args=["acme", unknown.run_id]))
    body = page.content.decode()
    assert 'hx-trigger="every 3s"' in body and "a retry awaits an approver" in body
    assert "HX-Request" in page["Vary"]
    live = reverse("run_live", args=["acme", unknown.run_id])
    seen = _marker(body)

    # Nothing changed: 204, nothing to swap, nothing written; a fixed number of queries.
    client.get(live, {"seen": seen}, **HX)  # the session's first request does its own
    before = AuditEvent.objects.count()
    poll, n = _count(lambda: client.get(live, {"seen": seen}, **HX))
    assert poll.status_code == 204 and "HX-Request" in poll["Vary"]
    assert n == POLL_QUERIES["run_live_unchanged"]
    assert AuditEvent.objects.count() == before

    # An approver decides elsewhere: the poll answers the run body, over the page's.
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="dedupes")
    poll = client.get(live, {"seen": seen}, **HX)
    assert poll.status_code == 200 and poll["HX-Retarget"] == "#run-body"
    assert poll["HX-Reswap"] == "outerHTML" and "HX-Request" in poll["Vary"]
    body = poll.content.decode()
    assert body.lstrip().startswith('<div id="run-body">')
    assert "an approved retry waits for the runtime" in body and "every 3s" in body
    seen = _marker(body)

    # The runtime resumes and completes: the body says so, on the database clock, and
    # polls no more.
    _resume_and_complete(wendy, acme, unknown)
    Run.objects.filter(uuid=unknown.run_id).update(
        state_changed_at=db_now() - timedelta(seconds=125))  # minutes: a slow poll is no flake
    poll = client.get(live, {"seen": seen}, **HX)
    body = poll.content.decode()
    assert poll.status_code == 200
    assert Run.objects.get(uuid=unknown.run_id).recovery_state == RecoveryState.COMPLETED
    assert re.search(r'id="run-ended">completed 2 min( \d+ s)? ago<', body), body[:3000]
    assert "every 3s" not in body and "run_live" not in body and "/live/" not in body


def test_a_run_with_nothing_pending_does_not_poll(login, rita, stuck):
    body = login(rita).get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    assert "every 3s" not in body and "/live/" not in body


def test_a_run_page_polls_while_a_reconciliation_is_queued(login, acme, rita, stuck,
                                                         monkeypatch):
    monkeypatch.setattr(reconcile_requests, "dispatch",
                        lambda pks, **kw: reconcile_requests.Sent(True, "queued for a worker"))
    services.run_reconcile(actor=rita, tenant=acme, run_id=stuck.run_id, reason="ask")
    body = login(rita).get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    assert "a reconciliation is under way" in body and "every 3s" in body


def test_the_live_poll_refuses_a_bad_marker_and_another_tenants_run(login, rita, omar, stuck):
    live = reverse("run_live", args=["acme", stuck.run_id])
    for query in ({}, {"seen": "xyz"}, {"seen": "0" * 13}):
        response = login(rita).get(live, query, **HX)
        assert response.status_code == 400 and "seen" in response.content.decode()
    assert login(omar).get(live, {"seen": "0" * 12}, **HX).status_code == 404


# --------------------------------------------------------------------------------------
# The inbox: one read for counts and list, "n new runs · show"
# --------------------------------------------------------------------------------------

def test_the_inbox_counts_agree_with_its_list_and_polls_new_runs(login, acme, rita, wendy):
    for _ in range(2):
        ambiguous_run(wendy, acme)
    client = login(rita)
    page = client.get(reverse("run_list", args=["acme"]), {"state": "ambiguous"})
    tabs = {value: n for value, _, n in page.context["tabs"]}
    assert tabs["ambiguous"] == len(page.context["rows"]) == 2
    body = page.content.decode()
    assert 'hx-trigger="every 10s"' in body and "/t/acme/new-runs/" in body
    since = page.context["since"]
    assert f"since={since}" in body
    poll_url = reverse("run_new", args=["acme"])

    client.get(poll_url, {"state": "ambiguous", "since": since}, **HX)
    response, n = _count(lambda: client.get(poll_url, {"state": "ambiguous", "since": since},
                                            **HX))
    assert response.status_code == 200 and "new run" not in response.content.decode()
    assert n == POLL_QUERIES["run_new"] and "HX-Request" in response["Vary"]

    # Two runs enter the tab (their state changed after the page's read), one elsewhere.
    before = AuditEvent.objects.count()
    _in_flight(wendy, acme, 2)
    put_checkpoint(wendy, acme, envelope())  # healthy: another tab
    sweep_later()  # one sweep: its ageing would otherwise move the first run's change back
    assert AuditEvent.objects.count() > before  # (the writes; the polls below write none)
    before = AuditEvent.objects.count()
    response, n = _count(lambda: client.get(
        poll_url, {"state": "ambiguous", "since": since}, **HX))
    body = response.content.decode()
    assert "2 new runs · show" in body and n == POLL_QUERIES["run_new"]
    assert AuditEvent.objects.count() == before
    # More runs cost the same; "show" reloads the tab, whose counts and rows agree.
    _in_flight(wendy, acme, 5)
    sweep_later()
    response, n = _count(lambda: client.get(
        poll_url, {"state": "ambiguous", "since": since}, **HX))
    assert "5 new runs" in response.content.decode() and n == POLL_QUERIES["run_new"]
    page = client.get(reverse("run_list", args=["acme"]), {"state": "ambiguous"}, **HX)
    tabs = {value: n for value, _, n in page.context["tabs"]}
    assert tabs["ambiguous"] == len(page.context["rows"]) == 9


def _in_flight(writer, tenant, n):
    for _ in range(n):
        put_checkpoint(writer, tenant, envelope(payload={"phase": "charging", "order_id": "B"}))


def test_the_new_runs_poll_checks_its_parameters(login, rita):
    url = reverse("run_new", args=["acme"])
    for query, name in (({}, "since"), ({"since": "abc"}, "since"),
                        ({"since": "1", "state": "nope"}, "state"),
                        ({"since": "1", "limit": "2"}, "limit")):
        response = login(rita).get(url, query, **HX)
        assert response.status_code == 400 and name in response.content.decode(), query


def test_since_is_the_database_time_of_the_read(login, rita, acme, wendy):
    ambiguous_run(wendy, acme)
    page = login(rita).get(reverse("run_list", args=["acme"]))
    since = selectors.from_micros(page.context["since"])
    assert abs((db_now() - since).total_seconds()) < 60
    assert selectors.to_micros(since) == page.context["since"]


# --------------------------------------------------------------------------------------
# The bulk result fills in
# --------------------------------------------------------------------------------------

def _bulk_reconcile(rita, acme, runs):
    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="reconcile",
                                   reason="outage 14:02", client_token=uuid.uuid4(),
                                   run_ids=[s.run_id for s in runs])
    return reverse("bulk_detail", args=["acme", bulk.uuid])


def test_a_bulk_reconcile_says_requested_until_each_lookup_answers(
        login, acme, rita, wendy, scripted, monkeypatch, api_as):
    monkeypatch.setattr(reconcile_requests, "dispatch",
                        lambda pks, **kw: reconcile_requests.Sent(True, "queued for a worker"))
    runs = [make_stuck_run(wendy, acme, order_id=f"A-{i}", key=f"charge:A-{i}")
            for i in range(2)]
    url = _bulk_reconcile(rita, acme, runs)
    api = api_as(rita)
    api_url = "/api/v1/tenants/acme/bulk-actions/" + url.rstrip("/").rsplit("/", 1)[1]

    def api_progress():  # what the dashboard shows, the API shows
        rows = api.get(api_url).json()["results"]
        return sorted((r["progress"], r["pending"]) for r in rows)

    assert api_progress() == [("queued", True), ("queued", True)]
    client = login(rita)
    page = client.get(url)
    body = page.content.decode()
    assert "2 requested" in body and "done" not in re.sub(r"<[^>]+>", " ", body).split()
    assert 'hx-trigger="every 3s"' in body
    # "What happened" follows the look-up too, never "requested" beside a settled outcome.
    assert body.count("its look-up has not answered yet") == 2

    client.get(url, **HX)
    before = AuditEvent.objects.count()
    fragment, n = _count(lambda: client.get(url, **HX))
    assert fragment.content.decode().lstrip().startswith('<div id="bulk-live"')
    assert n == POLL_QUERIES["bulk_live"] and "HX-Request" in fragment["Vary"]
    assert AuditEvent.objects.count() == before

    # The first look-up answers "found": that run is confirmed, the other still asked.
    first = ReconcileRequest.objects.get(run__uuid=runs[0].run_id)
    reconciliation.execute(first.pk)
    body = client.get(url, **HX).content.decode()
    assert "1 confirmed" in body and "1 requested" in body and "every 3s" in body
    assert body.count("its look-up has not answered yet") == 1
    assert body.count("then its look-up answered (see Outcome)") == 1
    assert api_progress() == [("confirmed", False), ("queued", True)]
    # The second: nobody can tell (no look-up): unknown; the table stops polling.
    scripted.answers = [Answer.no_lookup()]
    reconciliation.execute(ReconcileRequest.objects.get(run__uuid=runs[1].run_id).pk)
    fragment, n = _count(lambda: client.get(url, **HX))
    body = fragment.content.decode()
    assert "1 confirmed" in body and "1 unknown" in body
    assert 'data-outcome="queued"' not in body and "every 3s" not in body
    assert n == POLL_QUERIES["bulk_live"]
    assert api_progress() == [("confirmed", False), ("unknown", False)]


def test_a_bulk_reconcile_whose_lookup_gave_up_does_not_say_it_answered(
        login, acme, rita, wendy, scripted, monkeypatch, settings):
    """(stop 32, the attack's finding) A look-up that gave up settles nothing: the row's
    "What happened" says so beside "gave up · waits for a human", never "answered"."""
    monkeypatch.setattr(reconcile_requests, "dispatch",
                        lambda pks, **kw: reconcile_requests.Sent(True, "queued for a worker"))
    settings.RECOVERY_RECONCILE_MAX_FAILURES = 1
    run = make_stuck_run(wendy, acme, order_id="A-9", key="charge:A-9")
    url = _bulk_reconcile(rita, acme, [run])
    scripted.answers = [Answer.cannot_tell("the provider is down")]
    reconciliation.execute(ReconcileRequest.objects.get(run__uuid=run.run_id).pk)
    body = login(rita).get(url).content.decode()
    assert "gave up · waits for a human" in body
    assert "its look-up gave up: a person decides" in body
    assert "answered" not in body


def test_the_bulk_fragment_costs_the_same_for_more_runs(login, acme, rita, wendy, monkeypatch):
    monkeypatch.setattr(reconcile_requests, "dispatch",
                        lambda pks, **kw: reconcile_requests.Sent(True, "queued for a worker"))
    client = login(rita)
    small = _bulk_reconcile(rita, acme, [make_stuck_run(wendy, acme, key="charge:1")])
    client.get(small, **HX)
    _, n_small = _count(lambda: client.get(small, **HX))
    big = _bulk_reconcile(rita, acme, [make_stuck_run(wendy, acme, key=f"charge:b{i}")
                                       for i in range(6)])
    _, n_big = _count(lambda: client.get(big, **HX))
    assert n_small == n_big == POLL_QUERIES["bulk_live"]


def test_a_bulk_close_still_says_done(login, acme, rita, wendy):
    run = ambiguous_run(wendy, acme)
    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="close", reason="by hand",
                                   client_token=uuid.uuid4(), run_ids=[run])
    body = login(rita).get(reverse("bulk_detail", args=["acme", bulk.uuid])).content.decode()
    assert "1 done" in body and "every 3s" not in body


def test_the_run_page_keeps_polling_while_the_runtime_holds_the_resumed_run(
        login, acme, rita, april, wendy, unknown):
    """Between the runtime's resume (the run healthy, its lease live) and its last write,
    the page keeps polling: it stopped there, and the run completed unseen (newcomer)."""
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                   reason="charge unconfirmed")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="dedupes")
    client = login(rita)
    seen = _marker(client.get(reverse("run_detail", args=["acme", unknown.run_id]))
                   .content.decode())
    services.resume_claim(actor=wendy, tenant=acme, run_id=unknown.run_id, asked={})
    services.lease_acquire(actor=wendy, tenant=acme, run_id=unknown.run_id,
                           owner="resume-worker-1", ttl_s=30)
    assert Run.objects.get(uuid=unknown.run_id).recovery_state == RecoveryState.HEALTHY
    poll = client.get(reverse("run_live", args=["acme", unknown.run_id]), {"seen": seen}, **HX)
    body = poll.content.decode()
    assert poll.status_code == 200 and "its runtime holds it" in body and "every 3s" in body


@pytest.mark.parametrize("since", [str(2**62), "253402300800000000", str(2**63 - 1)])
def test_a_since_past_the_last_datetime_is_a_400_not_a_500(login, rita, since):
    """Attack (issue 21, item 8): ``since`` took any revision number (to 2^63 - 1) but is
    turned into a datetime, whose last microsecond is 9999-12-31 (253402300799999999 µs
    since the epoch): past it the poll answered 500 (OverflowError)."""
    client = login(rita)
    client.raise_request_exception = False
    response = client.get(reverse("run_new", args=["acme"]), {"since": since}, **HX)
    assert response.status_code == 400 and "since" in response.content.decode()
    last = client.get(reverse("run_new", args=["acme"]), {"since": "253402300799999999"},
                      **HX)
    assert last.status_code == 200
