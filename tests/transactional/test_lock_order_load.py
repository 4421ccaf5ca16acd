"""The stale-run sweep and the runtime's writes under load, on real PostgreSQL (issue 17,
item 10): no deadlock, ever.

Threads, each on its own database connection, for about ``DURATION_S`` seconds:

- runtime writers, through the API the runtime uses (bearer token, ``PUT`` of
  checkpoints, whose update takes the SQL write path, ``PUT`` of effects, leases, and
  writes refused as stale or fenced, which keep a conflict in their own transaction), on
  a shared set of runs, each writer moving on to another run after a few writes;
- sweepers calling ``services.sweep_stale_runs`` in a loop: the tenant's ambiguity
  threshold is 1 s, so a run a writer left a second ago is stale, and the sweep moves its
  submitted effects to ``unresolved`` and the run to ``ambiguous`` while writers come
  back to it.

Then: the database's own count of deadlocks (``pg_stat_database.deadlocks`` of the test
database) did not move, no API write answered a 5xx (a deadlock answers 503) and no
sweep pass raised. The sweep must also have done real work (runs made ambiguous, effects
unresolved) so the test cannot pass by never meeting the writers. Before the single lock
order (``checkpoints/locks.py``) this test counted deadlocks on every run.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter

import pytest
from django.db import connection

from checkpoints import services
from tests.api.apihelpers import post, put_cp, put_fx, url
from tests.conftest import bearer_client
from tests.helpers import effect_body, envelope

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True),
              pytest.mark.no_schema_check(reason="answers from many threads at once; the "
                                                 "API tests check the schema")]

DURATION_S = 12
RUNS = 24
WRITERS = 6
SWEEPERS = 2


def _deadlocks() -> int:
    """The test database's deadlock count, once every other backend of it has exited
    (a backend flushes its statistics at exit at the latest)."""
    deadline = time.monotonic() + 15
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid()")
            if cursor.fetchone()[0] == 0:
                break
            time.sleep(0.05)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = "
                       "current_database()")
        return cursor.fetchone()[0]


def _etag(response) -> int:
    return int(response["ETag"].strip('"'))


class Writer:
    """One runtime: writes a few times to one run, then moves on to another."""

    def __init__(self, index: int, user, runs: list[dict], stop: float, failures: list,
                 statuses: Counter, lock: threading.Lock):
        self.rng = random.Random(index)
        self.client = bearer_client(user)
        self.runs, self.stop = runs, stop
        self.failures, self.statuses, self.lock = failures, statuses, lock
        self.owner = f"writer-{index}"

    def note(self, what: str, response) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1
            if response.status_code >= 500:
                self.failures.append(f"{what}: {response.status_code} {response.content[:300]!r}")

    def checkpoint(self, run: dict, token=None, stale: bool = False) -> None:
        cid = run["checkpoint_id"]
        got = self.client.head(url("acme", f"checkpoints/{cid}"))
        self.note("HEAD checkpoint", got)
        if got.status_code != 200:
            return
        revision = _etag(got) - (1 if stale and _etag(got) > 0 else 0)
        phase = self.rng.choice(["charging", "charging", "ready"])
        body = envelope(checkpoint_id=cid, run_id=run["run_id"], revision=revision + 1,
                        payload={"phase": phase, "order_id": "A-1"})
        self.note("PUT checkpoint", put_cp(self.client, "acme", body, match=revision,
                                           token=token))

    def effect(self, run: dict, token=None) -> None:
        body = effect_body(run_id=run["run_id"],
                           operation_key=f"charge:{uuid.uuid4()}")
        r = put_fx(self.client, "acme", body, create=True, token=token)
        self.note("PUT effect (create)", r)
        if r.status_code not in (200, 201):
            return
        r = put_fx(self.client, "acme", dict(body, revision=1, state="submitted"), match=0,
                   token=token)
        self.note("PUT effect (submitted)", r)
        if r.status_code == 200 and self.rng.random() < 0.3:
            self.note("PUT effect (confirmed)", put_fx(
                self.client, "acme", dict(body, revision=2, state="confirmed",
                                          receipt={"charge_id": "ch_1"}), match=1,
                token=token))

    def lease_then_fenced(self, run: dict) -> None:
        r = post(self.client, "acme", f"runs/{run['run_id']}/lease",
                 {"owner": self.owner, "ttl_s": 1})
        self.note("POST lease", r)
        if r.status_code != 200:
            return
        token = json.loads(r.content)["fencing_token"]
        self.checkpoint(run, token=token)
        self.effect(run, token=token)
        self.checkpoint(run, token=token - 1)  # a zombie's write: fenced, kept as a conflict

    def __call__(self) -> None:
        try:
            while time.monotonic() < self.stop:
                run = self.rng.choice(self.runs)
                pick = self.rng.random()
                if pick < 0.15:
                    self.lease_then_fenced(run)
                else:
                    self.checkpoint(run)
                    self.effect(run)
                    if pick < 0.35:
                        self.checkpoint(run, stale=True)  # refused as stale: a conflict
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            with self.lock:
                self.failures.append(f"writer raised {type(exc).__name__}: {exc}")
        finally:
            connection.close()


def test_the_sweep_and_runtime_writes_never_deadlock(acme, wendy):
    services.tenant_set_ambiguity_threshold(actor=None, tenant=acme, seconds=1)
    setup = bearer_client(wendy)
    runs = []
    for _ in range(RUNS):
        body = envelope(payload={"phase": "charging", "order_id": "A-1"})
        assert put_cp(setup, "acme", body, create=True).status_code == 201
        runs.append({"run_id": body["run_id"], "checkpoint_id": body["id"]})
        fx = effect_body(run_id=body["run_id"], operation_key=f"charge:{uuid.uuid4()}")
        assert put_fx(setup, "acme", fx, create=True).status_code == 201
        assert put_fx(setup, "acme", dict(fx, revision=1, state="submitted"),
                      match=0).status_code == 200

    failures: list[str] = []
    statuses: Counter = Counter()
    swept: Counter = Counter()
    lock = threading.Lock()
    before = _deadlocks()
    stop = time.monotonic() + DURATION_S

    def sweeper() -> None:
        try:
            while time.monotonic() < stop:
                try:
                    stats = services.sweep_stale_runs()
                except Exception as exc:  # noqa: BLE001 - collected and asserted on
                    with lock:
                        failures.append(f"sweep raised {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    swept.update(stats)
                    swept["passes"] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=Writer(i, wendy, runs, stop, failures, statuses, lock))
               for i in range(WRITERS)]
    threads += [threading.Thread(target=sweeper) for _ in range(SWEEPERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DURATION_S + 60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    deadlocks = _deadlocks() - before

    summary = (f"deadlocks={deadlocks} failures={len(failures)} statuses={dict(statuses)} "
               f"sweep={dict(swept)}")
    print(summary)
    assert deadlocks == 0, f"{summary}\n" + "\n".join(failures[:10])
    assert not failures, f"{summary}\n" + "\n".join(failures[:10])
    # It met the writers: the sweep found stale runs and moved them while they were written.
    assert swept["runs_ambiguous"] >= 5 and swept["effects_unresolved"] >= 5, summary
    assert statuses[200] + statuses[201] >= 50, summary
    assert services.audit_verify(tenant=acme)[0]
