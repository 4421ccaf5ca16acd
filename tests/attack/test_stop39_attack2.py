"""Stop 39, second attack: the lease release (API and SDK), the SDK's per-run tokens,
``/readyz?scope=node``, ``export_keyring --out``. Each finding is a test of what SHOULD
hold, marked ``xfail(strict=True)`` with the fault in one line; tests without a mark are
attacks that failed (kept where they cover something not yet tested)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from unittest import mock

import pytest
from celery.worker.request import Request, revoked_tasks
from django.conf import settings
from kombu import Message

from checkpoints import services
from checkpoints.exceptions import InvalidPayload
from checkpoints.jobs import tasks  # registers the tasks beat names
from checkpoints.models import Run
from checkpoints.services.leases import owner_check
from recovery.celery import app
from recovery_client import core
from recovery_client.client import HttpCheckpointStore, next_revision, owner_name
from tests.api.apihelpers import get, new_checkpoint, post
from tests.client.conftest import make_store, open_store, store  # noqa: F401 - fixtures
from tests.conftest import _person
from tests.helpers import envelope

pytestmark = pytest.mark.django_db(transaction=True)


def _create(store) -> dict:  # noqa: F811 - the fixture's name
    body = envelope()
    assert store.compare_and_swap(body, None) == 0
    return body


# FIXED FINDING: the SDK keys its per-run fencing tokens by the run id's spelling: a run
# leased as its upper-case UUID (which the server takes) has its own writes sent without a
# token and fenced
def test_a_run_leased_in_another_spelling_of_its_id_keeps_its_token(store):  # noqa: F811
    first = _create(store)
    run_id = first["run_id"]
    taken = store.lease(run_id.upper(), "worker-1", ttl_s=3600)  # the same run, per the server
    assert taken["fencing_token"] == 1
    assert store.compare_and_swap(next_revision(first, {"phase": "charging"}), 0) == 1
    assert store.fencing_token_of(run_id) == 1


# FIXED FINDING: beat's expires is a deadline on beat's host clock that the worker judges on
# its own: a worker 15 s ahead drops every audit-integrate and notify tick as expired (10
# s), so neither ever runs
def test_a_beat_tick_runs_on_a_worker_whose_clock_is_a_little_ahead():
    """``_beat``'s ``expires`` (recovery/settings.py, stop 39): Celery turns the seconds
    into an absolute time on the sender's clock (beat's), and the worker's
    ``Request.maybe_expire`` compares it with ``datetime.now()`` on its own host: no
    database clock between them. Each entry's tick must survive a skew of 15 s between
    two hosts (no NTP in a container), not be revoked on arrival."""
    real = datetime

    class Ahead(datetime):  # the worker host's clock, 15 s ahead of beat's
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + timedelta(seconds=15)

    dropped = []
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        task_id = f"attack2-{uuid.uuid4()}"
        sent = app.amqp.as_task_v2(task_id, entry["task"], expires=entry["options"]["expires"])
        message = Message(body=sent.body, headers=sent.headers,
                          content_type="application/json", content_encoding="utf-8")
        request = Request(message, app=app, task=app.tasks[entry["task"]], body=sent.body,
                          headers=sent.headers, decoded=True)
        with mock.patch("celery.worker.request.datetime", Ahead):
            if request.maybe_expire():
                dropped.append(name)
        revoked_tasks.discard(task_id)
    assert tasks.audit_integrate.name in app.tasks
    assert dropped == []


# FIXED FINDING: MAX_RUN_TOKENS drops the run least recently LEASED, not used as core.py
# says: a run this store writes all along (renewed by keep_leased's own store) loses its
# token to newer leases, and its next write is fenced
def test_the_store_forgets_the_token_of_the_run_least_recently_used(store, monkeypatch):  # noqa: F811
    """``core.MAX_RUN_TOKENS`` ("least recently used dropped first"), here 2: a long run X
    (its lease renewed by ``keep_leased``'s own store, so never leased again through
    this one) is written after Y was leased; leasing Z must drop Y, untouched since, not
    X, whose writes go on."""
    monkeypatch.setattr(core, "MAX_RUN_TOKENS", 2)
    x, y, z = _create(store), _create(store), _create(store)
    store.lease(x["run_id"], "worker-1", ttl_s=3600)
    store.lease(y["run_id"], "worker-1", ttl_s=3600)
    assert store.compare_and_swap(next_revision(x, {"phase": "step-1"}), 0) == 1
    store.lease(z["run_id"], "worker-1", ttl_s=3600)
    x1 = next_revision(x, {"phase": "step-1"})
    assert store.compare_and_swap(next_revision(x1, {"phase": "step-2"}), 1) == 2
    assert store.fencing_token_of(y["run_id"]) is None


# FIXED FINDING: owner_name(prefix) checks only the prefix's length: a NUL or a bidi
# override makes a name every lease then refuses 400, instead of ValueError at once
@pytest.mark.parametrize("prefix", ["order\x00worker", "order\u202eworker", "order\nworker"])
def test_owner_name_refuses_a_prefix_the_server_would_refuse(prefix):
    """``owner_name`` (clients/python/recovery_client/client.py, stop 39) raises
    ``ValueError`` for a prefix too long for the server's rule; a prefix the same rule
    refuses otherwise (``services.leases.owner_check``: the name rule) must be refused as
    early, not answer a name that fails at the first ``lease``."""
    with pytest.raises(InvalidPayload):  # the server's rule refuses such an owner
        owner_check(f"{prefix}:host:1:uuid")
    with pytest.raises(ValueError):
        owner_name(prefix)


# FIXED FINDING: release_lease inside keep_leased is undone: the renewer thread's next
# lease() takes the released lease again (a new token, live for ttl_s), so the next worker
# waits out the ttl after all
def test_a_lease_released_inside_keep_leased_stays_released(live_server, wendy):
    """docs/client.md: keep the lease renewed while a long call runs
    (``keep_leased``), and give it back when done or shutting down (``release_lease``).
    Released inside the block, a renewal must not take it again. Sync client (its
    renewals run on a thread with a store of their own)."""
    with HttpCheckpointStore(live_server.url, "acme",
                             services.token_issue(user=wendy)) as sync:
        first = _create(sync)
        run_id = first["run_id"]
        with sync.keep_leased(run_id, "worker-1", ttl_s=3600, every_s=0.2) as kept:
            given = sync.release_lease(run_id, "worker-1")
            for _ in range(30):  # 3 s: many renewals' time, even on a loaded machine
                time.sleep(0.1)
                if Run.objects.get(uuid=run_id).fencing_token != given["fencing_token"]:
                    break
        assert kept["error"] is None
    run = Run.objects.get(uuid=run_id)
    assert run.fencing_token == given["fencing_token"]  # nothing took it since
    assert run.lease_ended_at is not None


# FIXED FINDING: lease/release's proof of holding (owner, fencing_token) is what GET
# …/runs/{id} shows every role: another writer reads it and ends a live runtime's lease, a
# reviewer's right (revoke)
def test_a_writer_who_is_not_the_holder_cannot_end_a_live_lease(api_as, wendy, acme):
    """``services.lease_release``: "``owner`` and ``fencing_token`` ... prove it is the
    holder"; ending another's live lease is ``lease_revoke``, a reviewer's. A second writer
    account (another team's runtime) reads the run, then releases the lease wendy's
    runtime holds: it must stay live (refused), not end with the holder fenced."""
    holder = api_as(wendy)
    body = new_checkpoint(holder, "acme", payload={"phase": "ready"})
    rid = body["run_id"]
    r = post(holder, "acme", f"runs/{rid}/lease", {"owner": "worker-1", "ttl_s": 3600})
    assert r.status_code == 200, r.content
    other = api_as(_person("attack2_writer", acme, "writer"))
    seen = get(other, "acme", f"runs/{rid}").json()["run"]
    r = post(other, "acme", f"runs/{rid}/lease/release",
             {"owner": seen["lease_owner"], "fencing_token": seen["fencing_token"]})
    assert r.status_code in (403, 409), r.content
    assert Run.objects.get(uuid=rid).fencing_token == 1  # the holder's writes go on
