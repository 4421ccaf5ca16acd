"""Issue 5, fault 5: a process whose clock is wrong changes nothing.

The process clock (``django.utils.timezone.now`` and ``time.time``) is patched 60 s ahead
(or behind) while the database's clock stays right: leases, "owner gone", the sweep and
reconcile are judged on the database's clock only (CONTRACT.md 3). Runs on PostgreSQL
and SQLite (whose ``'now'`` is read by SQLite's C code, not through Python's clock).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints import services
from checkpoints.exceptions import LeaseHeld, OwnerLive
from checkpoints.models import AuditEvent, Effect, ReconcileRequest, Run
from tests.api.apihelpers import post, snapshot
from tests.faults.conftest import in_doubt_run
from tests.helpers import age_world, envelope, put_checkpoint


@pytest.fixture
def skew(monkeypatch):
    """``skew(seconds)``: from now on this process's clock is off by ``seconds``."""
    real_now, real_time = timezone.now, time.time

    def shift(seconds: float) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=seconds))
        monkeypatch.setattr(time, "time", lambda: real_time() + seconds)

    return shift


def test_the_patched_clock_really_is_ahead(skew):
    before = timezone.now()
    skew(60)
    assert timezone.now() - before >= timedelta(seconds=59)
    assert time.time() - before.timestamp() >= 59


def test_a_clock_ahead_does_not_grant_a_second_lease_while_the_first_is_live(
        acme, wendy, api_as, skew):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    first = services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"],
                                   owner="worker-1", ttl_s=30)
    skew(60)  # on this node's clock the 30 s lease ran out half a minute ago

    with pytest.raises(LeaseHeld):
        services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"],
                               owner="worker-2", ttl_s=30)
    before = snapshot()
    r = post(api_as(wendy), "acme", f"runs/{body['run_id']}/lease",
             {"owner": "worker-2", "ttl_s": 30})
    assert r.status_code == 409 and r.json()["error"] == "lease_held"
    assert snapshot() == before
    # The live owner renews: same token, nobody fenced.
    again = services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"],
                                   owner="worker-1", ttl_s=30)
    assert again.fencing_token == first.fencing_token


@pytest.mark.parametrize("lease_ttl", [30, None], ids=["leased", "no_lease_recent_write"])
def test_a_sweep_on_a_clock_ahead_leaves_a_live_run_alone(acme, wendy, skew, lease_ttl):
    run = in_doubt_run(wendy, acme, lease_ttl=lease_ttl)
    # 60 s is past the lease; with no lease, 400 s is past the tenant's 300 s threshold.
    skew(60 if lease_ttl else 400)
    events = AuditEvent.objects.count()

    stats = services.sweep_stale_runs()

    assert (stats["effects_unresolved"], stats["runs_ambiguous"]) == (0, 0)
    assert Effect.objects.get(uuid=run.effects["charge:A-1"]).state == "submitted"
    assert Run.objects.get(uuid=run.run_id).recovery_state == "healthy"
    assert AuditEvent.objects.count() == events


@pytest.mark.parametrize("lease_ttl", [30, None], ids=["leased", "no_lease_recent_write"])
def test_reconcile_on_a_clock_ahead_still_answers_owner_live(acme, wendy, rita, api_as, skew,
                                                             lease_ttl):
    run = in_doubt_run(wendy, acme, lease_ttl=lease_ttl)
    skew(60 if lease_ttl else 400)
    with pytest.raises(OwnerLive):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="stuck")
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "stuck"})
    assert r.status_code == 409 and r.json()["error"] == "owner_live"
    assert snapshot() == before
    assert not ReconcileRequest.objects.exists()


def test_a_clock_behind_does_not_keep_an_expired_lease_alive(acme, wendy, skew):
    """The other direction: the lease expired on the database's clock, so a second owner
    gets it and the sweep calls the first one gone, though this node's clock is behind."""
    run = in_doubt_run(wendy, acme, lease_ttl=30)
    age_world(31)
    skew(-60)
    stats = services.sweep_stale_runs()
    assert stats["effects_unresolved"] == 1
    assert Run.objects.get(uuid=run.run_id).recovery_state == "ambiguous"
    second = services.lease_acquire(actor=wendy, tenant=acme, run_id=run.run_id,
                                    owner="worker-2", ttl_s=30)
    assert second.fencing_token == run.token + 1


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql path", "orm path"])
def test_a_runtime_writes_audit_event_carries_the_database_time_not_the_process_clock(
        acme, wendy, skew, settings, sql_path):
    """A checkpoint or effect write's audit event is stamped with the time its run lock
    read (the SQL write path always was; the ORM path, SQLite's only one, took this
    process's clock): with the process an hour ahead, each event's time is its write's
    (the checkpoint's ``received_at``, the run's last write)."""
    from tests.helpers import effect_body, put_effect

    settings.RECOVERY_SQL_WRITE_PATH = sql_path
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    skew(3600)
    checkpoint = put_checkpoint(wendy, acme, dict(body, revision=1,
                                                  payload={"phase": "charging", "n": 1}),
                                expected=0)
    written = AuditEvent.objects.filter(action="checkpoint.write").latest("seq")
    assert written.created_at == checkpoint.received_at
    put_effect(wendy, acme, effect_body(run_id=body["run_id"], operation_key="charge:A-1"))
    effect_event = AuditEvent.objects.filter(action="effect.write").latest("seq")
    assert effect_event.created_at == Run.objects.get().last_write_at
    assert effect_event.created_at < timezone.now() - timedelta(minutes=30)


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql path", "orm path"])
@pytest.mark.parametrize("action", ["lease acquire", "run close"])
def test_a_runs_audit_events_do_not_go_back_in_time_across_its_writes(
        acme, wendy, rita, skew, settings, sql_path, action):
    """(attack-clock) A run's audit trail is one history: a checkpoint write's event now
    carries its run lock's database time, so every other event of the run written under
    the run's lock must too, or the trail of one run mixes two clocks and goes back in
    time. With this process an hour ahead: a checkpoint write, then a lease acquire (or a
    reviewer's close), then the next checkpoint write; the events in ``seq`` order must
    not go back."""
    settings.RECOVERY_SQL_WRITE_PATH = sql_path
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    skew(3600)
    if action == "lease acquire":
        services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"],
                               owner="worker-1", ttl_s=30)
        token = Run.objects.get().fencing_token
    else:
        services.run_close(actor=rita, tenant=acme, run_id=body["run_id"], reason="done")
        token = None
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "charging", "n": 1}),
                   expected=0, token=token)
    events = list(AuditEvent.objects.filter(run_uuid=body["run_id"]).order_by("seq")
                  .values_list("action", "created_at"))
    assert len(events) == 3, events
    for (a, at), (b, bt) in zip(events, events[1:], strict=False):
        assert at <= bt, f"{b} at {bt} is before {a} at {at}"


def test_the_sweep_and_a_reconcile_request_stamp_their_events_with_the_database_time(
        acme, wendy, rita, skew):
    """The run-scoped events written by the stale-run sweep (``effect.unresolved``,
    ``run.ambiguous``) and by a reconcile request (``run.reconcile``) carry their run
    lock's database time, as the run's writes do: with this process an hour ahead none of
    them is stamped in this process's future (each was, before)."""
    from tests.faults.conftest import in_doubt_run

    run = in_doubt_run(wendy, acme)
    age_world(3600)  # the owner went quiet an hour ago
    skew(3600)
    services.sweep_stale_runs()
    services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="stuck")
    events = dict(AuditEvent.objects.filter(
        action__in=["effect.unresolved", "run.ambiguous", "run.reconcile"])
        .values_list("action", "created_at"))
    assert set(events) == {"effect.unresolved", "run.ambiguous", "run.reconcile"}, events
    db_time = Run.objects.get().updated_at
    for action, at in events.items():
        assert at <= db_time + timedelta(seconds=5), (action, at, db_time)


def test_a_runifold_imports_audit_events_carry_the_database_time_of_its_writes(
        acme, wendy, skew):
    """(attack-final) A runifold import writes checkpoints and effects of runs under their
    run locks (``locks.lock_runs``), as the API's writes do, and stamps the rows with the
    database time; its audit events (``checkpoint.import``, ``effect.import``) must carry
    that time too, or a run's trail mixes two clocks. With this process an hour ahead the
    import's events were stamped in this process's future (``audit_record_many`` took
    ``timezone.now()``), after the API write that followed them."""
    import io
    from pathlib import Path

    from checkpoints.interop import runifold
    from checkpoints.models import Checkpoint

    root = Path(__file__).resolve().parent.parent / "fixtures" / "runifold"
    first = (root / "history.jsonl").read_bytes().splitlines(keepends=True)[0]
    skew(3600)
    report = runifold.runifold_import(actor=wendy, tenant=acme,
                                      lines=runifold.jsonl_lines(io.BytesIO(first)))
    assert report.failed == 0, report
    event = AuditEvent.objects.filter(action="checkpoint.import").get()
    checkpoint = Checkpoint.objects.get()
    assert event.created_at == checkpoint.received_at
    assert event.created_at == Run.objects.get().last_write_at
    assert event.created_at < timezone.now() - timedelta(minutes=30)


def test_a_reveal_and_a_tenant_level_event_carry_the_database_time(acme, wendy, rita, adam,
                                                                   skew):
    """(stop 32) An event with no run lock to read the time from (a payload reveal, a
    tenant's threshold change, a new tenant's registration) is stamped with the
    database's time too, never this process's clock: with the process an hour ahead,
    none of them is in its future (each was, before: ``audit_record``'s fallback)."""
    from checkpoints.models import AuditTenant, Checkpoint

    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging"}))
    skew(3600)
    services.payload_reveal(actor=rita, tenant=acme, checkpoint=Checkpoint.objects.get(),
                            reason="what did it send?")
    services.tenant_set_ambiguity_threshold(actor=adam, tenant=acme, seconds=120)
    services.tenant_create(slug="initech", actor=None)
    stamped = dict(AuditEvent.objects.filter(
        action__in=["payload.reveal", "tenant.threshold"]).values_list("action", "created_at"))
    stamped["registration"] = AuditTenant.objects.get(slug="initech").created_at
    assert len(stamped) == 3, stamped
    for what, at in stamped.items():
        assert at < timezone.now() - timedelta(minutes=30), (what, at)


@pytest.mark.parametrize("seconds", [3600, -3600], ids=["clock ahead", "clock behind"])
def test_the_dashboard_says_live_or_expired_by_the_database_clock(
        acme, wendy, rita, skew, seconds):
    """(stop 32) The run page's lease badge and the inbox's "(expired)" were decided by
    the web process's clock: a node an hour ahead showed a live lease as expired (a
    reviewer reads "owner gone" where reconcile is refused), one an hour behind showed an
    expired lease as live. They follow the database's clock, the rule reconcile applies."""
    from django.test import Client

    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"],
                           owner="worker-1", ttl_s=60)
    live = seconds > 0  # behind: the lease is aged past its end, on the database's clock
    if not live:
        age_world(120)
    skew(seconds)
    client = Client()
    client.force_login(rita)
    page = client.get(f"/t/acme/runs/{body['run_id']}/").content.decode()
    inbox = client.get("/t/acme/?state=all").content.decode()
    assert ('badge-green">live' in page) is live, page
    assert ('badge-grey">expired' in page) is not live
    assert "worker-1" in inbox
    assert ("(expired)" in inbox) is not live


def test_rows_are_created_at_the_database_time_so_the_approval_queue_keeps_its_order(
        acme, wendy, rita, april, skew):
    """(stop 32, the attack's finding) ``created_at`` of runs, effects, retry and
    reconcile requests was ``auto_now_add``: the writing process's clock. A retry
    requested through a node an hour ahead sorted after one requested later through a
    right one, in the approver's queue ("oldest first"). Now the database stamps it."""
    from checkpoints import selectors
    from checkpoints.models import RetryRequest
    from tests.faults.conftest import in_doubt_run

    first = in_doubt_run(wendy, acme, keys=("charge:A-1",))
    second = in_doubt_run(wendy, acme, keys=("charge:A-2",))
    age_world(3600)
    for run in (first, second):
        [effect_id] = run.effects.values()
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect_id,
                                     reason="no look-up")
    skew(3600)
    services.retry_request(actor=rita, tenant=acme, run_id=first.run_id, reason="first")
    skew(0)
    services.retry_request(actor=rita, tenant=acme, run_id=second.run_id, reason="second")
    queue = selectors.approval_queue(user=april, tenant=acme)
    assert [row.retry.reason for row in queue.rows] == ["first", "second"]
    assert RetryRequest.objects.get(reason="first").created_at < timezone.now()
    assert Run.objects.get(uuid=first.run_id).created_at < timezone.now()


def test_a_pages_relative_times_are_measured_on_the_database_clock(acme, wendy, rita, skew):
    """(stop 32, the attack's finding) "3 min ago" / "in 10 min" were measured against
    the web process's clock: on a node an hour ahead the run page said a lease "live"
    that expires "50 min ago", and the owner-live refusal said the same. They are
    measured against the request's database time (``dbclock.page_now``)."""
    from django.test import Client

    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"],
                           owner="worker-1", ttl_s=600)
    skew(3600)
    client = Client()
    client.force_login(rita)
    page = client.get(f"/t/acme/runs/{body['run_id']}/").content.decode()
    expires = page.split("<dt>Expires</dt>", 1)[1].split("</dd>", 1)[0]
    assert ">in 9 min<" in expires or ">in 10 min<" in expires, expires
    assert 'badge-green">live' in expires
    inbox = client.get("/t/acme/?state=all").content.decode()
    assert "min ago" not in inbox.split("worker-1", 1)[0].rsplit("<tr", 1)[-1]
    assert " h ago<" not in inbox


def test_bulk_inserted_rows_leave_created_at_to_the_database(acme, wendy, skew):
    """(stop 32, the second attack) ``sql.insert_rows`` promises a column a row leaves
    out takes its default; with ``created_at`` a database default, the PostgreSQL path
    (COPY) passed Django's ``DatabaseDefault`` marker to psycopg and failed, while
    SQLite's ``bulk_create`` passed. Both now leave it to the database."""
    import uuid as uuidlib

    from checkpoints import sql

    put_checkpoint(wendy, acme, envelope())
    skew(3600)
    stamp = Run.objects.get().last_write_at
    rid = uuidlib.uuid4()
    sql.insert_rows(Run, [dict(tenant_id=acme.pk, uuid=rid, last_write_at=stamp,
                               updated_at=stamp)])
    created = Run.objects.get(uuid=rid).created_at
    assert created is not None and created < timezone.now() - timedelta(minutes=30)
