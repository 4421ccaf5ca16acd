"""Attack on the LangGraph put's SQL path (``interop.langgraph.put._put_sql``, issue 22
item 3, commit 3014945): a fresh pair of eyes looking for any difference from the ORM
path (``_put_orm``, the reference) in answers, status codes, rows written, audit events
and conflicts recorded.

Each parity scenario runs twice on the same thread ids: in acme with the SQL path, in
globex with ``_put_sql`` handing every put back (``FALLBACK``), so the only difference
between the two tenants is ``_put_sql`` itself (the envelope's own SQL write path stays
on in both), and again with ``RECOVERY_SQL_WRITE_PATH`` off for globex (the ORM path of
both the put and the envelope write, as ``tests/services/test_langgraph_sqlpath.py``
compares). Rows are compared as that file does.

Covered (all agree with the reference, so these stay as regression tests): a closed run
(reopened), effects in doubt, an approved retry, a refuse secrets policy (a secret in the
identity or the metadata's ``source``), subject fields, declared kinds, a crypto-shredded
tenant, values at every column limit (ASCII and 4-byte characters, U+0000 inside the
metadata, a 200 KB metadata value, ``metadata.run_id`` of 128 characters, ``step`` at
both ends of int64), the database clock, an INSERT failing after the compare-and-swap
(all rolled back, session usable), the API's statuses, random walks of puts, and races
on real PostgreSQL: a fast put against a stale one, a lease acquire, an erasure, a thread
delete, both prunes, a copy from and onto the thread, ``delete_for_runs``, and fast puts
on many threads at once (the audit chain verifies).
"""

from __future__ import annotations

import json
import random

import pytest
from django.db import DatabaseError, connection

from checkpoints import crypto, services
from checkpoints.exceptions import DomainError, Fenced, RunDeleted, ThreadConflict
from checkpoints.interop import langgraph
from checkpoints.interop.langgraph import put as put_module
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    Conflict,
    DataPolicy,
    GraphCheckpoint,
    Run,
    RunSubject,
)
from checkpoints.sql import FALLBACK
from recovery_client.protocol import thread_run_id
from tests.conftest import _person
from tests.helpers import (
    effect_body,
    graph_put,
    graph_writes,
    lg_put,
    lg_writes,
    sweep_later,
    walk_effect,
)
from tests.services.test_langgraph import IDENT, ids
from tests.services.test_langgraph_sqlpath import graph_rows, untimed
from tests.services.test_writepath import rows
from tests.transactional.test_races import kinds_of, race
from tests.twinworld import DECLARED_KIND, declared_kind

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREAD = "thread-attack"


class Both:
    """Runs a scenario in acme through ``_put_sql`` and in globex through the ORM path
    only, and compares what each answered and left."""

    #: The SQL path under test: ``module.name`` (the put's; put_writes' attack subclasses).
    module, name = put_module, "_put_sql"

    def __init__(self, monkeypatch, settings, reference="fallback"):
        self.monkeypatch = monkeypatch
        self.settings = settings
        self.reference = reference
        settings.RECOVERY_SQL_WRITE_PATH = True
        self.calls = {"written": 0, "fallback": 0}
        self.real = getattr(self.module, self.name)
        self.mode = "sql"

        def counting(*args, **kwargs):
            if self.mode == "orm":
                return FALLBACK
            answer = self.real(*args, **kwargs)
            self.calls["fallback" if answer is FALLBACK else "written"] += 1
            return answer

        monkeypatch.setattr(self.module, self.name, counting)

    def run(self, scenario, acme, globex, people_acme, people_globex):
        self.mode = "sql"
        fast = scenario(acme, people_acme)
        written = dict(self.calls)
        self.mode = "orm"
        # The reference: the ORM path of the put, its envelope written by the write path's
        # SQL dialect ("fallback") or by its ORM dialect too ("sql_off", as
        # tests/services/test_langgraph_sqlpath.py compares).
        self.settings.RECOVERY_SQL_WRITE_PATH = self.reference != "sql_off"
        try:
            slow = scenario(globex, people_globex)
        finally:
            self.settings.RECOVERY_SQL_WRITE_PATH = True
        return fast, slow, written

    @staticmethod
    def compare(acme, globex, fast, slow):
        assert fast == slow
        fast_rows, slow_rows = untimed(rows(acme)), untimed(rows(globex))
        for tables in (fast_rows, slow_rows):  # a retry's id differs by tenant
            tables["events"] = [(e[0], e[1], e[2] if e[1] in ("checkpoint", "run") else None,
                                 *e[3:]) for e in tables["events"]]
        for table in fast_rows:
            assert fast_rows[table] == slow_rows[table], table
        assert graph_rows(acme) == graph_rows(globex)


def attempt(answers, fn):
    try:
        answers.append(("ok", fn()))
    except DomainError as exc:
        answers.append((type(exc).__name__, exc.status, str(exc)))


@pytest.fixture(params=["fallback", "sql_off"])
def both(request, monkeypatch, settings):
    return Both(monkeypatch, settings, request.param)


@pytest.fixture
def people(acme, globex, wendy, wes, rita, april, omar):
    return ({"w": wendy, "r": rita, "a": april},
            {"w": wes, "r": omar, "a": _person("gail", globex, "approver")})


# --------------------------------------------------------------------------------------
# 4. Runs in other states: closed, effects in doubt, an approved retry
# --------------------------------------------------------------------------------------

def test_a_put_reopens_a_closed_run_as_the_orm_path_does(both, acme, globex, people):
    c = ids(4)

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",))))
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[1], parent=c[0], nodes=("a",))))
        services.run_close(actor=p["r"], tenant=tenant, run_id=thread_run_id(THREAD),
                           reason="handled by hand")
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[2], parent=c[1], nodes=("b",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written["written"] == 2
    both.compare(acme, globex, fast, slow)
    assert Run.objects.for_tenant(acme).get().closed_at is None


def test_a_put_on_a_run_with_effects_in_doubt_keeps_its_state(both, acme, globex, people):
    c = ids(4)

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",))))
        walk_effect(p["w"], tenant, effect_body(effect_id="6f2b8d1c-0000-4000-8000-000000000001",
                                                run_id=thread_run_id(THREAD)),
                    "submitted", "unresolved")
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[1], parent=c[0], nodes=("b",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written["written"] == 1
    both.compare(acme, globex, fast, slow)


def test_a_put_on_a_run_with_an_approved_retry(both, acme, globex, people):
    c = ids(4)

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",))))
        run = services.lease_acquire(actor=p["w"], tenant=tenant,
                                     run_id=thread_run_id(THREAD), owner="w1", ttl_s=1)
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[1], parent=c[0], nodes=("b",)),
                                       token=run.fencing_token))
        sweep_later()
        retry = services.retry_request(actor=p["r"], tenant=tenant,
                                       run_id=thread_run_id(THREAD), reason="stuck")
        services.retry_approve(actor=p["a"], tenant=tenant, retry_id=retry.pk, reason="ok")
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[2], parent=c[1], nodes=("c",)),
                                       token=run.fencing_token))
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[3], parent=c[2], nodes=("c",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    both.compare(acme, globex, fast, slow)


# --------------------------------------------------------------------------------------
# 3. Tenants with a data policy: refuse secrets, subject fields
# --------------------------------------------------------------------------------------

SECRET = "AKIA" + "IOSFODNN7" + "Q2ZK4XW"


def test_a_refuse_policy_with_a_secret_in_the_identity(both, acme, globex, people):
    c = ids(4)

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",))))
        DataPolicy.objects.update_or_create(tenant=tenant,
                                            defaults={"secrets_policy": "refuse"})
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            THREAD, c[1], parent=c[0], identity={"workflow": SECRET}, nodes=("b",))))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            THREAD, c[1], parent=c[0], nodes=("b",),
            metadata={"source": SECRET, "step": 2, "parents": {}})))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            THREAD, c[1], parent=c[0], nodes=("b",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    both.compare(acme, globex, fast, slow)
    assert [a[0] for a in fast] == ["ok", "SecretDetected", "SecretDetected", "ok"]
    assert GraphCheckpoint.objects.for_tenant(acme).count() == 2


def test_subject_fields_declared(both, acme, globex, people):
    c = ids(4)

    def scenario(tenant, p):
        out = []
        services.data_policy_set(actor=None, tenant=tenant,
                                 subject_fields={"wf": "/identity/workflow",
                                                 "thread": "/thread_id"})
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",),
                                                                identity=IDENT)))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            THREAD, c[1], parent=c[0], identity={"workflow": "other"}, nodes=("b",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written["written"] == 1
    both.compare(acme, globex, fast, slow)
    a = sorted(RunSubject.objects.for_tenant(acme).values_list("field", "digest"))
    g = sorted(RunSubject.objects.for_tenant(globex).values_list("field", "digest"))
    assert len(a) == len(g) and a


# --------------------------------------------------------------------------------------
# 1. Hostile values at their limits
# --------------------------------------------------------------------------------------

def test_values_at_their_column_limits(both, acme, globex, people):
    thread = "t" * 256
    ns = "n" * 256
    c = ["1" * 127 + "0", "1" * 127 + "1", "1" * 127 + "2"]
    meta = {"source": "s" * 64, "step": 2**63 - 1, "parents": {}, "run_id": "r" * 128,
            "note": "\u0000 nul \u2028", "big": "x" * 200_000}

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(thread, c[0], ns=ns,
                                                                nodes=("a",))))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            thread, c[1], parent=c[0], ns=ns, nodes=("b" * 246,), metadata=meta)))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            thread, c[2], ns=ns, nodes=("c",),
            metadata={**meta, "step": -(2**63), "source": "\u0000"})))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    print([a[:2] if a[0] == "ok" else a for a in fast], written)
    assert written["written"] == 2
    both.compare(acme, globex, fast, slow)
    g = GraphCheckpoint.objects.for_tenant(acme).get(checkpoint_id=c[1])
    assert g.lg_run_id == "r" * 128


def test_the_database_clock_is_used(both, acme, globex, people):
    """``created_at`` of the row and the envelope's ``received_at`` are the database's
    time of the put's lock (the process's clock never)."""
    c = ids(3)
    graph_put(people[0]["w"], acme, lg_put(THREAD, c[0], nodes=("a",)))
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        before = cur.fetchone()[0]
    graph_put(people[0]["w"], acme, lg_put(THREAD, c[1], parent=c[0], nodes=("a",)))
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        after = cur.fetchone()[0]
    g = GraphCheckpoint.objects.for_tenant(acme).get(checkpoint_id=c[1])
    env = Checkpoint.objects.for_tenant(acme).get()
    ev = AuditEvent.objects.for_tenant(acme).filter(action="checkpoint.write").latest("seq")
    assert before <= g.created_at <= after
    assert g.created_at == env.received_at == ev.created_at
    assert env.updated_at_ms == int(g.created_at.timestamp() * 1000)
    assert Conflict.objects.count() == 0


# --------------------------------------------------------------------------------------
# 6. Written half: the INSERT failing after the compare-and-swap
# --------------------------------------------------------------------------------------

def test_an_insert_failing_after_the_cas_rolls_everything_back(acme, wendy, settings,
                                                               monkeypatch):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(3)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    before = untimed(rows(acme)), graph_rows(acme)
    broken = put_module._insert_sql().replace("VALUES (", "VALUES (1/0, ", 1)
    monkeypatch.setattr(put_module, "_insert_sql", lambda: broken)
    with pytest.raises(DatabaseError):  # Django's (the sync goes through its wrapper)
        graph_put(wendy, acme, lg_put(THREAD, c[1], parent=c[0], nodes=("b",)))
    assert not connection.in_atomic_block
    assert connection.connection.pgconn.transaction_status == 0  # IDLE: nothing open
    assert (untimed(rows(acme)), graph_rows(acme)) == before
    monkeypatch.undo()
    settings.RECOVERY_SQL_WRITE_PATH = True
    answer = graph_put(wendy, acme, lg_put(THREAD, c[1], parent=c[0], nodes=("b",)))
    assert answer["revision"] == 1
    assert services.audit_verify(tenant=acme)[0]


# --------------------------------------------------------------------------------------
# 2. Races on real PostgreSQL (threads on their own connections)
# --------------------------------------------------------------------------------------

def _whole(tenant):
    """Whatever survived is whole: every graph row has its envelope, each envelope's
    revision is its namespace head's row's, and the audit chain verifies."""
    for env in Checkpoint.objects.for_tenant(tenant):
        rows_ = GraphCheckpoint.objects.for_tenant(tenant).filter(envelope=env)
        head = rows_.order_by("-checkpoint_id").first()
        assert head is not None
    assert services.audit_verify(tenant=tenant)[0]


def test_a_fast_put_racing_a_stale_one(acme, wendy, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(40)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    head, older, n = c[0], None, 1
    for _ in range(6):
        a, b = c[n], c[n + 1]
        n += 2
        results = race(2, lambda i, a=a, b=b, head=head, older=older: graph_put(
            wendy, acme, lg_put(THREAD, a, parent=head, nodes=("a",)) if i == 0
            else lg_put(THREAD, b, parent=older or head, nodes=("a",))))
        assert all(isinstance(r, dict | ThreadConflict) for r in results), results
        assert kinds_of(results)["dict"] >= 1
        winners = [r["checkpoint_id"] for r in results if isinstance(r, dict)]
        older, head = head, max(winners)
    assert Run.objects.for_tenant(acme).get().unacknowledged_conflicts == \
        Conflict.objects.for_tenant(acme).count()
    _whole(acme)


def test_a_put_racing_a_lease_acquire(acme, wendy, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(2)
    for k in range(6):
        thread = f"{THREAD}-{k}"
        graph_put(wendy, acme, lg_put(thread, c[0], nodes=("a",)))
        results = race(2, lambda i, thread=thread: graph_put(
            wendy, acme, lg_put(thread, c[1], parent=c[0], nodes=("a",))) if i == 0
            else services.lease_acquire(actor=wendy, tenant=acme,
                                        run_id=thread_run_id(thread), owner="o", ttl_s=60))
        assert isinstance(results[0], dict | Fenced), results
        assert not isinstance(results[1], Exception), results
        run = Run.objects.for_tenant(acme).get(uuid=thread_run_id(thread))
        fenced = Conflict.objects.for_tenant(acme).filter(run=run, reason="fenced").count()
        assert fenced == (1 if isinstance(results[0], Fenced) else 0)
    _whole(acme)


# --------------------------------------------------------------------------------------
# 3. A tenant with declared kinds; a tenant crypto-shredded between two puts
# --------------------------------------------------------------------------------------

def test_a_tenant_with_declared_kinds(both, acme, globex, people):
    c = ids(3)

    def scenario(tenant, p):
        out = []
        services.kind_declare(actor=None, tenant=tenant, kind=DECLARED_KIND, version=1,
                              body=declared_kind("attack"))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",))))
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[1], parent=c[0], nodes=("b",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written["written"] == 1
    both.compare(acme, globex, fast, slow)


def test_a_put_after_the_tenant_was_shredded(both, acme, globex, people):
    c = ids(3)

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",))))
        services.tenant_shred(actor=None, tenant=tenant, confirm_slug=tenant.slug)
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[1], parent=c[0], nodes=("b",))))
        attempt(out, lambda: graph_put(p["w"], tenant,
                                       lg_put(THREAD, c[1], parent=c[0], nodes=("b",),
                                              identity=IDENT)))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert fast == slow  # 410 erased on both paths (the envelope is unreadable)
    assert [a[0] for a in fast] == ["ok", "DataKeyGone", "DataKeyGone"]
    for model in (Checkpoint, GraphCheckpoint, Conflict, AuditEvent):
        assert (model.objects.for_tenant(acme).count()
                == model.objects.for_tenant(globex).count()), model
    assert connection.connection.pgconn.transaction_status == 0


# --------------------------------------------------------------------------------------
# Through the API: the SQL path is the one a request takes, with the same statuses
# --------------------------------------------------------------------------------------

def test_the_api_takes_the_sql_path_with_the_orm_paths_statuses(both, acme, globex, people,
                                                                 api_as):
    c = ids(4)

    def scenario(tenant, p):
        client = api_as(p["w"])
        out = []

        def post(body, token=None):
            headers = {} if token is None else {"HTTP_FENCING_TOKEN": str(token)}
            r = client.post(f"/api/v1/tenants/{tenant.slug}/langgraph/checkpoints",
                            data=json.dumps(body), content_type="application/json",
                            **headers)
            out.append((r.status_code, r.json()))

        post(lg_put(THREAD, c[0], nodes=("a",)))
        post(lg_put(THREAD, c[1], parent=c[0], nodes=("a",), identity=IDENT,
                    metadata={"source": "loop", "step": 1, "parents": {}, "run_id": "r" * 128,
                              "big": "x" * 500_000}))
        post(lg_put(THREAD, c[1], parent=c[0], nodes=("a",), identity=IDENT,
                    metadata={"source": "loop", "step": 1, "parents": {}, "run_id": "r" * 128,
                              "big": "x" * 500_000}))
        post(lg_put(THREAD, c[2], parent=c[1], nodes=("a",)), token=2**63 - 1)
        post(lg_put(THREAD, c[2], parent=c[1], nodes=("a",)), token=0)
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written["written"] == 2
    assert [s for s, _ in fast] == [201, 201, 200, 409, 201]
    both.compare(acme, globex, fast, slow)


def test_a_put_racing_an_erasure(acme, wendy, rita, april, settings):
    """The next put of a finished thread racing its erasure: the put commits first (and
    the erasure deletes it too, or counts the run as not ended), or it is refused
    409 ``run_deleted``; never a half thread, never a 500."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(2)
    outcomes = []
    for k in range(4):
        thread = f"{THREAD}-e{k}"
        graph_put(wendy, acme, lg_put(thread, c[0]))  # no next node: completed
        assert Run.objects.for_tenant(acme).get(uuid=thread_run_id(thread)).recovery_state \
            == "completed"
        request = services.erasure_request(actor=rita, tenant=acme,
                                           runs=[str(thread_run_id(thread))], reason="x")
        results = race(2, lambda i, thread=thread, request=request: graph_put(
            wendy, acme, lg_put(thread, c[1], parent=c[0])) if i == 0
            else services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid))
        assert isinstance(results[0], dict | RunDeleted), results
        assert not isinstance(results[1], Exception), results
        outcomes.append(type(results[0]).__name__)
        run = Run.objects.for_tenant(acme).get(uuid=thread_run_id(thread))
        graph = GraphCheckpoint.objects.for_tenant(acme).filter(thread_id=thread)
        if run.payloads_deleted_at is not None:
            assert not graph.exists()
            assert not Checkpoint.objects.for_tenant(acme).filter(run=run).exists()
    _whole(acme)


def test_fast_puts_on_many_threads_at_once_keep_the_audit_chain(acme, wendy, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(4)
    for i in range(8):
        graph_put(wendy, acme, lg_put(f"{THREAD}-m{i}", c[0], nodes=("a",)))
    for k in range(1, 4):
        results = race(8, lambda i, k=k: graph_put(
            wendy, acme, lg_put(f"{THREAD}-m{i}", c[k], parent=c[k - 1], nodes=("a",))))
        assert kinds_of(results) == {"dict": 8}, results
    assert GraphCheckpoint.objects.for_tenant(acme).count() == 32
    assert services.audit_verify(tenant=acme)[0]


def test_astral_values_at_their_character_limits(both, acme, globex, people):
    """Limits count characters: 4-byte characters at every limit make the unique key's
    index entry about 2.6 KB (PostgreSQL's B-tree limit is 2704 bytes)."""
    thread = "\U0001F600" * 256
    ns = "\U00010348" * 256
    c = ["\U0001F601" * 127 + "0", "\U0001F601" * 127 + "1", "\U0001F601" * 127 + "2"]

    def scenario(tenant, p):
        out = []
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(thread, c[0], ns=ns,
                                                                nodes=("a",))))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(
            thread, c[1], parent=c[0], ns=ns, nodes=("\U0001F602" * 246,),
            metadata={"source": "\U0001F603" * 64, "step": 1, "parents": {},
                      "run_id": "\U0001F604" * 128})))
        attempt(out, lambda: graph_put(p["w"], tenant, lg_put(thread, c[2], parent=c[1],
                                                                ns=ns, nodes=("a",))))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert [a[0] for a in fast] == ["ok"] * 3
    assert written["written"] == 2
    both.compare(acme, globex, fast, slow)


def _thread_op(other: str, writer, tenant, thread: str, copy: str):
    return {
        "delete": lambda: langgraph.graph_thread_delete(actor=writer, tenant=tenant,
                                                        thread_id=thread),
        "prune_keep_latest": lambda: langgraph.graph_threads_prune(
            actor=writer, tenant=tenant, thread_ids=[thread], strategy="keep_latest"),
        "prune_delete": lambda: langgraph.graph_threads_prune(
            actor=writer, tenant=tenant, thread_ids=[thread], strategy="delete"),
        "copy_from": lambda: langgraph.graph_thread_copy(
            actor=writer, tenant=tenant, source_thread_id=thread, target_thread_id=copy),
        "copy_onto": lambda: langgraph.graph_thread_copy(
            actor=writer, tenant=tenant, source_thread_id=copy, target_thread_id=thread),
        "runs_delete": lambda: langgraph.graph_runs_delete(actor=writer, tenant=tenant,
                                                           run_ids=["lg-run"]),
    }[other]


def _thread_to_race(writer, tenant, thread: str, copy: str, c: list[str], other: str) -> None:
    """``thread`` with two checkpoints ``c[0]`` and ``c[1]`` (the second in LangGraph run
    ``lg-run``), and for ``copy_onto`` the thread ``copy`` holding ``c[0]``: what a thread
    operation ``other`` (``_thread_op``) races."""
    graph_put(writer, tenant, lg_put(thread, c[0], nodes=("a",)))
    graph_put(writer, tenant, lg_put(thread, c[1], parent=c[0], nodes=("a",),
                                     metadata={"source": "loop", "step": 1, "parents": {},
                                               "run_id": "lg-run"}))
    if other == "copy_onto":
        graph_put(writer, tenant, lg_put(copy, c[0], nodes=("a",)))


@pytest.mark.parametrize("other", ["delete", "prune_keep_latest", "prune_delete",
                                   "copy_from", "copy_onto", "runs_delete"])
def test_a_fast_put_racing_a_thread_operation(acme, wendy, settings, other):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(4)
    for k in range(3):
        thread, copy = f"{THREAD}-o{k}", f"{THREAD}-copy{k}"
        _thread_to_race(wendy, acme, thread, copy, c, other)
        op = _thread_op(other, wendy, acme, thread, copy)
        results = race(2, lambda i, thread=thread, op=op: graph_put(
            wendy, acme, lg_put(thread, c[2], parent=c[1], nodes=("a",))) if i == 0
            else op())
        assert isinstance(results[0], dict | ThreadConflict), results
        assert not isinstance(results[1], Exception) or isinstance(
            results[1], ThreadConflict), results
    _whole(acme)
    for env in Checkpoint.objects.for_tenant(acme):
        head = (GraphCheckpoint.objects.for_tenant(acme).filter(envelope=env)
                .order_by("-checkpoint_id").first())

        summary = json.loads(crypto.decrypt_text(env.payload_ciphertext))
        assert summary["checkpoint_id"] == head.checkpoint_id, (other, summary, head)


# --------------------------------------------------------------------------------------
# A random walk of puts, the same on both paths
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_random_walk_of_puts(both, acme, globex, people, seed):


    def scenario(tenant, p):
        rnd = random.Random(seed)
        out = []
        pool = [f"1f0c3a2e-{i:04x}-6000-8000-000000000000" for i in range(0, 400, 7)]
        stored = {"": [], "sub": []}
        token = [None]
        for step in range(45):
            ns = rnd.choice(["", "", "", "sub"])
            roll = rnd.random()
            if roll < 0.05:
                run = None
                try:
                    run = services.lease_acquire(actor=p["w"], tenant=tenant,
                                                 run_id=thread_run_id(THREAD), owner="o",
                                                 ttl_s=60)
                except DomainError as exc:
                    out.append(("lease", type(exc).__name__))
                if run is not None:
                    token[0] = run.fencing_token
                continue
            if roll < 0.09 and stored[ns]:
                attempt(out, lambda ns=ns, step=step: graph_writes(p["w"], tenant, lg_writes(
                    THREAD, stored[ns][-1], f"task-{step}", [(0, "x", step)], ns=ns),
                    token=token[0]))
                continue
            if roll < 0.12:
                try:
                    services.run_close(actor=p["r"], tenant=tenant,
                                       run_id=thread_run_id(THREAD), reason="by hand")
                except DomainError as exc:
                    out.append(("close", type(exc).__name__))
                continue
            kind = rnd.random()
            head = max(stored[ns]) if stored[ns] else None
            later = [x for x in pool if head is None or x > head]
            cid = rnd.choice(later[:3] or pool)
            if kind < 0.55:
                parent = head
            elif kind < 0.7:
                parent = None
            elif kind < 0.85 and stored[ns]:
                parent = rnd.choice(stored[ns])
                if parent == cid:
                    parent = None
            else:
                parent = rnd.choice(pool)
                if parent == cid:
                    parent = None
            identity = rnd.choice([None, None, IDENT, {"agent": f"a{step % 3}"}])
            nodes = rnd.choice([(), ("a",), ("a", "b")])
            tok = rnd.choice([token[0], token[0], token[0], None, 0, 99])
            body = lg_put(THREAD, cid, parent=parent, ns=ns, identity=identity, nodes=nodes,
                          values={"n": step % 4})
            if rnd.random() < 0.2:
                body["interrupt_before"] = ["a"]
            n = len(out)
            attempt(out, lambda body=body, tok=tok: graph_put(p["w"], tenant, body,
                                                              token=tok))
            if out[n][0] == "ok" and cid not in stored[ns]:
                stored[ns].append(cid)
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written["written"] >= 5, written
    both.compare(acme, globex, fast, slow)
    assert services.audit_verify(tenant=acme)[0]
