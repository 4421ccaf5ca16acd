"""Attack on the LangGraph put_writes' SQL path (``interop.langgraph.writes._writes_sql``,
issue 22 item 3, commit 0409a0c): a fresh pair of eyes looking for any difference from
the ORM path (``graph_put_writes``' own, the reference: ``_store_writes``,
``_after_writes``) in answers, status codes and rows (pending writes, envelope
revisions, runs, conflicts, audit events).

Each parity scenario runs twice on the same thread ids, as
``tests/attack/test_issue22_lgput.py`` does: in acme with ``_writes_sql``, in globex with
``_writes_sql`` handing every call back (``fallback``), and again with
``RECOVERY_SQL_WRITE_PATH`` off for globex (``sql_off``); rows are compared column by
column, the pending writes too (``write_rows``).
"""

from __future__ import annotations

import json

import pytest
from django.db import DataError, IntegrityError, connection

from checkpoints import crypto, services
from checkpoints.exceptions import DomainError, NotFound, RunDeleted
from checkpoints.interop import langgraph
from checkpoints.interop.langgraph import writes as writes_module
from checkpoints.interop.langgraph.parse import ERROR, INTERRUPT, NULL_TASK_ID
from checkpoints.jsonparse import dumps
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    Conflict,
    DataPolicy,
    GraphCheckpoint,
    GraphWrite,
    Run,
    RunSubject,
)
from recovery_client.protocol import thread_checkpoint_id, thread_run_id
from tests.attack import test_issue22_lgput as lgput
from tests.attack.test_issue22_lgput import _thread_op, attempt
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
from tests.services.test_langgraph_sqlpath import graph_rows, untimed, write_rows
from tests.services.test_writepath import rows
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREAD = "thread-attack-w"


class Both(lgput.Both):
    """``lgput.Both`` for ``_writes_sql``: a scenario in acme through it, in globex through
    the ORM path only; the comparison also covers the pending writes and the audit."""

    module, name = writes_module, "_writes_sql"

    @staticmethod
    def compare(acme, globex, fast, slow):
        lgput.Both.compare(acme, globex, fast, slow)
        assert write_rows(acme) == write_rows(globex)
        assert services.audit_verify(tenant=acme)[0]


@pytest.fixture(params=["fallback", "sql_off"])
def both(request, monkeypatch, settings):
    return Both(monkeypatch, settings, request.param)


@pytest.fixture
def people(acme, globex, wendy, wes, rita, april, omar):
    return ({"w": wendy, "r": rita, "a": april},
            {"w": wes, "r": omar, "a": _person("gail", globex, "approver")})


def summary_of(tenant, thread=THREAD, ns="") -> dict:
    env = Checkpoint.objects.for_tenant(tenant).get(
        uuid=thread_checkpoint_id(thread, ns))
    return json.loads(crypto.decrypt_text(env.payload_ciphertext))


def facts_agree(tenant) -> None:
    """Every envelope's summary holds its head's write facts."""
    for env in Checkpoint.objects.for_tenant(tenant):
        summary = json.loads(crypto.decrypt_text(env.payload_ciphertext))
        head = (GraphCheckpoint.objects.for_tenant(tenant).filter(envelope=env)
                .order_by("-checkpoint_id").first())
        assert head is not None and summary["checkpoint_id"] == head.checkpoint_id
        pairs = set(GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint=head)
                    .values_list("task_id", "channel"))
        tasks = {t for t, _ in pairs} - {NULL_TASK_ID}
        channels = {c for _, c in pairs}
        assert (summary["written_tasks"], summary["interrupted"], summary["errored"]) == (
            len(tasks), INTERRUPT in channels, ERROR in channels), (summary, pairs)


# --------------------------------------------------------------------------------------
# 1. Hostile bodies reaching the multi-row INSERT
# --------------------------------------------------------------------------------------

WEIRD = ["NULL", "null", 'a,"b"', "x\\y", "{__interrupt__}", " __error__ ", "a,__error__",
         "\u00e9\U0001F600", "{}", '"', "NULL,NULL"]


def test_hostile_bodies_at_every_limit(both, acme, globex, people):
    c = ids(3)

    def scenario(tenant, p):
        out = []
        w = p["w"]
        graph_put(w, tenant, lg_put(THREAD, c[0], nodes=("a",), identity=IDENT))
        graph_put(w, tenant, lg_put(THREAD, c[1], parent=c[0], nodes=("a", "b")))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "task-big", [(i, f"c{i % 7}", i) for i in range(-500, 500)])))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "dupneg", [(-3, INTERRUPT, "a"), (0, "x", 0), (-3, INTERRUPT, "b"),
                                     (-1, ERROR, "e"), (-1, ERROR, "f")])))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "t" * 128, [(-2**31, "c" * 256, 1), (2**31 - 1, "d" * 256, 2)],
            task_path="p" * 1024)))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "\U0001F600" * 128,
            [(-2**31, "\U0001F601" * 256, 1), (2**31 - 1, "\U00010348" * 256, "\U0001F602")],
            task_path="\U00010348" * 1024)))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "NULL", [(i, ch, ch) for i, ch in enumerate(WEIRD)])))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], 'a,"b"', [(0, "x", "y" * 700_000)])))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "last", [(0, "x", 0)])))
        out.append(summary_of(tenant)["written_tasks"])
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 7, "fallback": 0}, written
    both.compare(acme, globex, fast, slow)
    assert [a[1] for a in fast[:7]] == [1000, 3, 2, 2, len(WEIRD), 1, 1]
    facts_agree(acme)
    s = summary_of(acme)
    assert s["interrupted"] and s["errored"] and s["written_tasks"] == 7


def test_weird_channels_never_read_as_an_interrupt(both, acme, globex, people):
    """The head's channels so far come back as a text array: a channel that looks like
    an array's syntax must not be read as ``__interrupt__``/``__error__``."""
    c = ids(2)

    def scenario(tenant, p):
        out = []
        w = p["w"]
        graph_put(w, tenant, lg_put(THREAD, c[0], nodes=("a",)))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[0], "NULL", [(i, ch, ch) for i, ch in enumerate(WEIRD)])))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[0], "t2", [(0, "x", 0)])))
        out.append(summary_of(tenant))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 2, "fallback": 0}
    both.compare(acme, globex, fast, slow)
    assert fast[-1]["interrupted"] is False and fast[-1]["errored"] is False
    assert fast[-1]["written_tasks"] == 2


# --------------------------------------------------------------------------------------
# 3. Facts: the null task, interrupts and errors already there, a subgraph, an envelope
# that does not summarise the head
# --------------------------------------------------------------------------------------

def test_facts_of_a_head_with_special_writes_already(both, acme, globex, people):
    c = ids(3)

    def scenario(tenant, p):
        out = []
        w = p["w"]
        graph_put(w, tenant, lg_put(THREAD, c[0], nodes=("a", "b"), identity=IDENT))
        for task, items in [(NULL_TASK_ID, [(0, "x", 1)]),
                            ("t1", [(-3, INTERRUPT, "ask")]),
                            ("t2", [(-1, ERROR, "boom")]),
                            (NULL_TASK_ID, [(1, INTERRUPT, 2)]),   # null task again: new idx
                            ("t3", [(0, "y", 3)]),
                            ("t1", [(-3, INTERRUPT, "ask again")]),  # replaced: ORM
                            ("t1", [(0, "z", 1)])]:
            attempt(out, lambda task=task, items=items: graph_writes(
                w, tenant, lg_writes(THREAD, c[0], task, items)))
            out.append(summary_of(tenant))
        # a subgraph namespace, then its writes
        graph_put(w, tenant, lg_put(THREAD, c[1], ns="child:1", nodes=("s",)))
        graph_put(w, tenant, lg_put(THREAD, c[2], parent=c[1], ns="child:1", nodes=("s",)))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[2], "sub", [(-3, INTERRUPT, "?"), (0, "q", 1)], ns="child:1",
            task_path="~__pregel_pull, s")))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "sub", [(0, "q", 1)], ns="child:1")))  # not the head: ORM
        out.append(summary_of(tenant, ns="child:1"))
        out.append(summary_of(tenant))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 7, "fallback": 2}, written
    both.compare(acme, globex, fast, slow)
    facts_agree(acme)


def _rewrite_envelope(tenant, payload) -> None:
    env = Checkpoint.objects.for_tenant(tenant).get(uuid=thread_checkpoint_id(
        THREAD, ""))
    Checkpoint.objects.filter(pk=env.pk).update(
        payload_ciphertext=crypto.encrypt_text(dumps(payload), tenant=tenant))


@pytest.mark.parametrize("stale", ["older_id", "not_a_summary", "not_an_object"])
def test_an_envelope_not_summarising_the_head_falls_back(both, acme, globex, people, stale):
    c = ids(3)

    def scenario(tenant, p):
        out = []
        w = p["w"]
        graph_put(w, tenant, lg_put(THREAD, c[0], nodes=("a",), identity=IDENT))
        before = summary_of(tenant)
        graph_put(w, tenant, lg_put(THREAD, c[1], parent=c[0], nodes=("b",)))
        _rewrite_envelope(tenant, {"older_id": before,
                                   "not_a_summary": dict(summary_of(tenant), tasks="x"),
                                   "not_an_object": [1, 2]}[stale])
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "t1", [(0, "x", 1)])))
        out.append(summary_of(tenant))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[1], "t2", [(-1, ERROR, "e")])))
        out.append(summary_of(tenant))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 1, "fallback": 1}, written
    both.compare(acme, globex, fast, slow)
    facts_agree(acme)


def test_writes_after_prune_and_copy(both, acme, globex, people):
    c = ids(4)

    def scenario(tenant, p):
        out = []
        w = p["w"]
        graph_put(w, tenant, lg_put(THREAD, c[0], nodes=("a",)))
        graph_writes(w, tenant, lg_writes(THREAD, c[0], "t0", [(0, "x", 0)]))
        graph_put(w, tenant, lg_put(THREAD, c[1], parent=c[0], nodes=("a",)))
        graph_writes(w, tenant, lg_writes(THREAD, c[1], "t1", [(-3, INTERRUPT, 0)]))
        graph_put(w, tenant, lg_put(THREAD, c[2], parent=c[1], nodes=("a",)))
        graph_writes(w, tenant, lg_writes(THREAD, c[2], "t2", [(0, "x", 0)]))
        langgraph.graph_threads_prune(actor=w, tenant=tenant, thread_ids=[THREAD],
                                      strategy="keep_latest")
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[2], "t3", [(-1, ERROR, 0)])))
        langgraph.graph_thread_copy(actor=w, tenant=tenant, source_thread_id=THREAD,
                                    target_thread_id="copy")
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            "copy", c[2], "t4", [(0, "x", 0)])))
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            "copy", c[2], "t3", [(-1, ERROR, 1)])))
        langgraph.graph_thread_delete(actor=w, tenant=tenant, thread_id=THREAD)
        attempt(out, lambda: graph_writes(w, tenant, lg_writes(
            THREAD, c[2], "t5", [(0, "x", 0)])))
        out.append(summary_of(tenant, "copy"))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    both.compare(acme, globex, fast, slow)
    facts_agree(acme)
    assert fast[-2][0] == "NotFound"


# --------------------------------------------------------------------------------------
# 4. Runs in other states: closed, effects in doubt, an approved retry, a lease, policies
# --------------------------------------------------------------------------------------

def test_writes_on_a_closed_run(both, acme, globex, people):
    c = ids(2)

    def scenario(tenant, p):
        out = []
        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",)))
        services.run_close(actor=p["r"], tenant=tenant, run_id=thread_run_id(THREAD),
                           reason="handled by hand")
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)])))
        services.run_close(actor=p["r"], tenant=tenant, run_id=thread_run_id(THREAD),
                           reason="again")
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)])))  # a retry: ORM, stays closed
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t2", [(-3, INTERRUPT, 1)])))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 2, "fallback": 1}
    both.compare(acme, globex, fast, slow)


def test_writes_on_a_run_with_effects_in_doubt(both, acme, globex, people):
    c = ids(2)

    def scenario(tenant, p):
        out = []
        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",)))
        walk_effect(p["w"], tenant, effect_body(effect_id="6f2b8d1c-0000-4000-8000-000000000002",
                                                run_id=thread_run_id(THREAD)),
                    "submitted", "unresolved")
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)])))
        sweep_later()
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t2", [(-1, ERROR, 1)])))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 2, "fallback": 0}
    both.compare(acme, globex, fast, slow)


def test_writes_with_an_approved_retry_and_tokens(both, acme, globex, people):
    c = ids(3)

    def scenario(tenant, p):
        out = []
        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",)))
        run = services.lease_acquire(actor=p["w"], tenant=tenant,
                                     run_id=thread_run_id(THREAD), owner="w1", ttl_s=1)
        tok = run.fencing_token
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)]), token=tok))
        graph_put(p["w"], tenant, lg_put(THREAD, c[1], parent=c[0], nodes=("b",)), token=tok)
        sweep_later()
        retry = services.retry_request(actor=p["r"], tenant=tenant,
                                       run_id=thread_run_id(THREAD), reason="stuck")
        services.retry_approve(actor=p["a"], tenant=tenant, retry_id=retry.pk, reason="ok")
        for task, token in [("t2", None), ("t3", tok + 1), ("t4", tok), ("t5", 0)]:
            attempt(out, lambda task=task, token=token: graph_writes(p["w"], tenant, lg_writes(
                THREAD, c[1], task, [(0, "x", 1), (-3, INTERRUPT, 1)]), token=token))
        out.append(Run.objects.for_tenant(tenant).values_list(
            "recovery_state", "recovery_reason", "unacknowledged_conflicts").get())
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    both.compare(acme, globex, fast, slow)
    assert written["written"] >= 2, written


def test_subject_fields_and_a_size_flag_declared_after_the_put(both, acme, globex, people):
    c = ids(2)

    def scenario(tenant, p):
        out = []
        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a", "b"), identity=IDENT))
        services.data_policy_set(actor=None, tenant=tenant, payload_flag_bytes=64,
                                 subject_fields={"wf": "/identity/workflow",
                                                 "thread": "/thread_id"})
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)])))
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1), (1, "y", 2)])))   # one taken: ORM, 1 stored
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(2, "y", 2), (-3, INTERRUPT, 3)])))
        out.append(sorted(RunSubject.objects.for_tenant(tenant).values_list("field", flat=True)))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert written == {"written": 2, "fallback": 1}, written
    assert [a[1] for a in fast[:3]] == [1, 1, 2]
    assert len(fast[3]) == 2
    both.compare(acme, globex, fast, slow)


SECRET = "AKIA" + "IOSFODNN7" + "Q2ZK4XW"


def test_a_refuse_policy_set_after_a_secret_identity(both, acme, globex, people):
    c = ids(2)

    def scenario(tenant, p):
        out = []
        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",),
                                         identity={"workflow": SECRET}))
        DataPolicy.objects.update_or_create(tenant=tenant,
                                            defaults={"secrets_policy": "refuse"})
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)])))
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, SECRET, SECRET)])))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    both.compare(acme, globex, fast, slow)
    assert GraphWrite.objects.for_tenant(acme).count() == \
        GraphWrite.objects.for_tenant(globex).count()
    assert connection.connection.pgconn.transaction_status == 0


def test_writes_after_the_tenant_was_shredded(both, acme, globex, people):
    c = ids(2)

    def scenario(tenant, p):
        out = []
        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",)))
        services.tenant_shred(actor=None, tenant=tenant, confirm_slug=tenant.slug)
        attempt(out, lambda: graph_writes(p["w"], tenant, lg_writes(
            THREAD, c[0], "t1", [(0, "x", 1)])))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert fast == slow
    for model in (Checkpoint, GraphWrite, Conflict, AuditEvent):
        assert (model.objects.for_tenant(acme).count()
                == model.objects.for_tenant(globex).count()), model


# --------------------------------------------------------------------------------------
# Through the API
# --------------------------------------------------------------------------------------

def test_the_api_statuses(both, acme, globex, people, api_as):
    c = ids(3)

    def scenario(tenant, p):
        client = api_as(p["w"])
        out = []

        def post(body, token=None):
            headers = {} if token is None else {"HTTP_FENCING_TOKEN": str(token)}
            r = client.post(f"/api/v1/tenants/{tenant.slug}/langgraph/writes",
                            data=json.dumps(body), content_type="application/json",
                            **headers)
            out.append((r.status_code, r.json()))

        graph_put(p["w"], tenant, lg_put(THREAD, c[0], nodes=("a",)))
        post(lg_writes(THREAD, c[0], "t" * 128, [(i, "c" * 256, "v") for i in range(1000)],
                       task_path="p" * 1024))
        post(lg_writes(THREAD, c[0], "t" * 129, [(0, "c", "v")]))
        post(lg_writes(THREAD, c[0], "t", [(0, "c" * 257, "v")]))
        post(lg_writes(THREAD, c[0], "t", [(2**31, "c", "v")]))
        post(lg_writes(THREAD, c[0], "t", [(0, "c", "v")] * 1001))
        post(lg_writes(THREAD, c[0], "t", [(0, "c\u0000", "v")]))
        post(lg_writes(THREAD, c[0], "t", [(0, "c", "v")], task_path="p" * 1025))
        post(lg_writes(THREAD, c[0], "t2", [(0, "c", "v")]), token=2**63 - 1)
        post(lg_writes(THREAD, c[0], "t2", [(0, "c", "v")]), token=0)
        post(lg_writes(THREAD, c[1], "t2", [(0, "c", "v")]))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    assert [s for s, _ in fast] == [200, 400, 400, 400, 400, 400, 400, 409, 200, 404], fast
    assert written["written"] == 2
    both.compare(acme, globex, fast, slow)


# --------------------------------------------------------------------------------------
# 5. The clock; 6. an INSERT failing after the compare-and-swap
# --------------------------------------------------------------------------------------

def test_the_database_clock_is_used(acme, wendy, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(1)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        before = cur.fetchone()[0]
    assert graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t", [(0, "x", 1), (1, "y", 2)])) \
        == 2
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        after = cur.fetchone()[0]
    env = Checkpoint.objects.for_tenant(acme).get()
    ev = AuditEvent.objects.for_tenant(acme).filter(action="checkpoint.write").latest("seq")
    stamps = set(GraphWrite.objects.for_tenant(acme).values_list("created_at", flat=True))
    assert len(stamps) == 1
    (stamp,) = stamps
    assert before <= stamp <= after
    assert stamp == env.received_at == ev.created_at
    assert env.updated_at_ms == int(stamp.timestamp() * 1000)
    run = Run.objects.for_tenant(acme).get()
    assert run.last_write_at == stamp


def test_an_insert_failing_after_the_cas_rolls_everything_back(acme, wendy, settings,
                                                               monkeypatch):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(1)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t0", [(0, "x", 1)]))
    before = untimed(rows(acme)), graph_rows(acme), write_rows(acme)
    real = writes_module._writes_insert

    def broken(*args):
        text, params = real(*args)
        return text.replace("VALUES (", "VALUES (1/0 + ", 1), params

    monkeypatch.setattr(writes_module, "_writes_insert", broken)
    with pytest.raises(DataError):  # division by zero, as Django's error
        graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t1", [(0, "x", 1), (1, "y", 2)]))
    assert not connection.in_atomic_block
    assert connection.connection.pgconn.transaction_status == 0  # IDLE: nothing open
    assert (untimed(rows(acme)), graph_rows(acme), write_rows(acme)) == before
    monkeypatch.undo()
    settings.RECOVERY_SQL_WRITE_PATH = True
    assert graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t1", [(0, "x", 1)])) == 1
    assert Checkpoint.objects.for_tenant(acme).get().revision == 2
    facts_agree(acme)
    assert services.audit_verify(tenant=acme)[0]


def test_a_unique_violation_in_the_insert_rolls_back(acme, wendy, settings, monkeypatch):
    """A row taken between the facts read and the INSERT (impossible under the run's
    lock; forced here by hiding it from the facts): Django's ``IntegrityError`` (the
    write transaction's closing sync goes through Django's error wrapper, as any other
    statement; it was psycopg's ``UniqueViolation``), nothing kept."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(1)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t0", [(0, "x", 1)]))
    before = untimed(rows(acme)), write_rows(acme)
    hidden = writes_module._writes_facts_sql().replace("= h.id", "= h.id AND FALSE")
    monkeypatch.setattr(writes_module, "_writes_facts_sql", lambda: hidden)
    with pytest.raises(IntegrityError):
        graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t0", [(0, "x", 1), (1, "y", 1)]))
    assert connection.connection.pgconn.transaction_status == 0
    assert (untimed(rows(acme)), write_rows(acme)) == before


# --------------------------------------------------------------------------------------
# 2. Races on real PostgreSQL
# --------------------------------------------------------------------------------------

def test_writes_racing_the_next_put(acme, wendy, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(12)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    landed = []
    for k in range(1, 9):
        results = race(2, lambda i, k=k: graph_writes(
            wendy, acme, lg_writes(THREAD, c[k - 1], f"task-{k}",
                                   [(0, "x", k), (-3, INTERRUPT, k)])) if i == 0
            else graph_put(wendy, acme, lg_put(THREAD, c[k], parent=c[k - 1], nodes=("a",))))
        assert results[0] == 2 and isinstance(results[1], dict), results
        audited = AuditEvent.objects.for_tenant(acme).filter(
            action="langgraph.writes", after__task_id=f"task-{k}").count()
        landed.append(audited)
    facts_agree(acme)
    assert services.audit_verify(tenant=acme)[0]
    assert Conflict.objects.for_tenant(acme).count() == 0
    assert all(n in (0, 1) for n in landed), landed


def test_two_put_writes_of_one_task_racing(acme, wendy, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(6)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    for k in range(6):
        results = race(3, lambda i, k=k: graph_writes(
            wendy, acme, lg_writes(THREAD, c[0], f"task-{k}",
                                   [(0, "x", i), (-1, ERROR, i)])))
        assert all(isinstance(r, int) for r in results), results
        assert sorted(results) == [1, 1, 2], results  # the others: the error replaced
        results = race(4, lambda i, k=k: graph_writes(
            wendy, acme, lg_writes(THREAD, c[0], f"task-{k}-{i}",
                                   [(0, "x", i), (-3 - (i % 2) * 0, INTERRUPT, i)])))
        assert results == [2] * 4, results
    facts_agree(acme)
    assert GraphWrite.objects.for_tenant(acme).count() == 12 + 6 * 8
    assert summary_of(acme)["written_tasks"] == 6 * 5
    assert services.audit_verify(tenant=acme)[0]


@pytest.mark.parametrize("other", ["delete", "prune_keep_latest", "prune_delete",
                                   "copy_from", "copy_onto", "runs_delete", "lease"])
def test_writes_racing_a_thread_operation(acme, wendy, settings, other):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(3)
    for k in range(3):
        thread, copy = f"{THREAD}-o{k}", f"{THREAD}-copy{k}"
        lgput._thread_to_race(wendy, acme, thread, copy, c, other)
        if other == "lease":
            def op(thread=thread):
                return services.lease_acquire(actor=wendy, tenant=acme,
                                              run_id=thread_run_id(thread), owner="o",
                                              ttl_s=60)
        else:
            op = _thread_op(other, wendy, acme, thread, copy)
        results = race(2, lambda i, thread=thread, op=op: graph_writes(
            wendy, acme, lg_writes(thread, c[1], "t", [(0, "x", 1), (-3, INTERRUPT, 1)]))
            if i == 0 else op())
        assert isinstance(results[0], int | NotFound | DomainError), results
        assert results[0] in (2,) or isinstance(results[0], NotFound | DomainError), results
        if isinstance(results[0], DomainError):
            assert results[0].status in (404, 409), results
        assert not isinstance(results[1], Exception) or isinstance(
            results[1], DomainError), results
    facts_agree(acme)
    assert services.audit_verify(tenant=acme)[0]


def test_writes_racing_an_erasure(acme, wendy, rita, april, settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(1)
    for k in range(4):
        thread = f"{THREAD}-e{k}"
        graph_put(wendy, acme, lg_put(thread, c[0]))  # completed
        request = services.erasure_request(actor=rita, tenant=acme,
                                           runs=[str(thread_run_id(thread))], reason="x")
        results = race(2, lambda i, thread=thread, request=request: graph_writes(
            wendy, acme, lg_writes(thread, c[0], "t", [(0, "x", 1)])) if i == 0
            else services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid))
        assert results[0] == 1 or isinstance(results[0], RunDeleted | NotFound), results
        assert not isinstance(results[1], Exception), results
        run = Run.objects.for_tenant(acme).get(uuid=thread_run_id(thread))
        if run.payloads_deleted_at is not None:
            assert not GraphWrite.objects.for_tenant(acme).filter(
                graph_checkpoint__thread_id=thread).exists()
    assert services.audit_verify(tenant=acme)[0]


def test_retries_at_the_idx_limits_once_the_facts_read_is_prepared(both, acme, globex,
                                                                    people):
    """The facts read runs often enough to be prepared on the server; the body's idx
    list is bound as an array whose element type follows its values (int2 for small
    ones): a retry at either int32 limit must still be seen as taken."""
    c = ids(1)

    def scenario(tenant, p):
        out = []
        w = p["w"]
        graph_put(w, tenant, lg_put(THREAD, c[0], nodes=("a",)))
        for k in range(7):
            attempt(out, lambda k=k: graph_writes(w, tenant, lg_writes(
                THREAD, c[0], f"small-{k}", [(0, "x", k), (1, "y", k)])))
        for task in ("big", "big", "big2", "big2"):
            attempt(out, lambda task=task: graph_writes(w, tenant, lg_writes(
                THREAD, c[0], task, [(2**31 - 1, "x", task), (-2**31, ERROR, task)])))
            attempt(out, lambda task=task: graph_writes(w, tenant, lg_writes(
                THREAD, c[0], task, [(-2**31, ERROR, "again")])))
            attempt(out, lambda task=task: graph_writes(w, tenant, lg_writes(
                THREAD, c[0], task, [(2**31 - 1, "x", "again")])))
        return out

    fast, slow, written = both.run(scenario, acme, globex, *people)
    both.compare(acme, globex, fast, slow)
    assert written == {"written": 9, "fallback": 10}, written


def test_fast_and_audited_only_writes_on_many_threads_keep_the_audit_chain(acme, wendy,
                                                                          settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(2)
    for i in range(6):
        graph_put(wendy, acme, lg_put(f"{THREAD}-m{i}", c[0], nodes=("a",)))
        graph_put(wendy, acme, lg_put(f"{THREAD}-m{i}", c[1], parent=c[0], nodes=("a",)))
    for k in range(3):
        results = race(6, lambda i, k=k: graph_writes(
            wendy, acme, lg_writes(f"{THREAD}-m{i}", c[i % 2], f"t{k}", [(0, "x", k)])))
        assert results == [1] * 6, results
    assert AuditEvent.objects.for_tenant(acme).filter(action="langgraph.writes").count() == 9
    facts_agree(acme)
    assert services.audit_verify(tenant=acme)[0]


def test_a_facts_read_failing_in_the_first_round_trip_leaves_the_session_usable(
        acme, wendy, settings, monkeypatch):
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(1)
    graph_put(wendy, acme, lg_put(THREAD, c[0], nodes=("a",)))
    before = untimed(rows(acme)), write_rows(acme)
    failing = writes_module._writes_facts_sql().replace("SELECT (SELECT",
                                                        "SELECT 1/0, (SELECT", 1)
    monkeypatch.setattr(writes_module, "_writes_facts_sql", lambda: failing)
    with pytest.raises(DataError):  # division by zero, as Django's error
        graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t0", [(0, "x", 1)]))
    assert connection.connection.pgconn.transaction_status == 0
    assert (untimed(rows(acme)), write_rows(acme)) == before
    monkeypatch.undo()
    settings.RECOVERY_SQL_WRITE_PATH = True
    assert graph_writes(wendy, acme, lg_writes(THREAD, c[0], "t0", [(0, "x", 1)])) == 1
    facts_agree(acme)
