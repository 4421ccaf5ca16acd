"""The LangGraph put's and put_writes' SQL paths (``interop.langgraph.put._put_sql``,
``writes._writes_sql``, PostgreSQL) write exactly what their ORM paths (the reference,
and SQLite's only path) write (issue 22, item 3: ``RecoverySaver.put`` and
``put_writes`` in two round trips each; a second script below covers the writes).

One script of puts runs twice on the same thread ids: in acme with the SQL path, in
globex with ``RECOVERY_SQL_WRITE_PATH`` off. The script has every case the SQL path
takes (the next checkpoint with and without identity, an append without a parent, a
static breakpoint, a subgraph namespace, a leased run with its token) and every case it
hands to the ORM path (a first put, a retry, a parent that is not the head, a fenced
token). Every row left (LangGraph checkpoints, envelopes and their revisions, runs,
conflicts, audit events) is compared column by column, as ``test_writepath`` compares
the checkpoint update's dialects. Outside a transaction (``transaction=True``): the SQL
path is the API's, which runs in autocommit.
"""

from __future__ import annotations

import pytest
from django.db import connection

from checkpoints import crypto, services
from checkpoints.exceptions import Fenced, NotFound, ThreadConflict
from checkpoints.interop.langgraph import put as put_module
from checkpoints.interop.langgraph import writes as writes_module
from checkpoints.interop.langgraph.parse import ERROR, INTERRUPT, NULL_TASK_ID
from checkpoints.models import GraphCheckpoint, GraphWrite
from checkpoints.sql import FALLBACK
from recovery_client.protocol import thread_run_id
from tests.helpers import graph_put, graph_writes, lg_put, lg_writes
from tests.services.test_langgraph import IDENT, ids
from tests.services.test_writepath import SKIP, TIMES, round_trips, rows

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREAD = "thread-sqlpath"


def counted(monkeypatch, module, name: str) -> dict:
    """``module.name`` (a SQL path) counting what it wrote and what it handed back."""
    calls = {"written": 0, "fallback": 0}
    real = getattr(module, name)

    def counting(*args, **kwargs):
        answer = real(*args, **kwargs)
        calls["fallback" if answer is FALLBACK else "written"] += 1
        return answer

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture
def sql_puts(monkeypatch):
    """Counts the puts the SQL path wrote (so the comparison cannot pass by both tenants
    taking the ORM path) and those it handed back."""
    return counted(monkeypatch, put_module, "_put_sql")


@pytest.fixture
def sql_writes(monkeypatch):
    """``sql_puts`` for ``put_writes`` (``writes._writes_sql``)."""
    return counted(monkeypatch, writes_module, "_writes_sql")


def script(writer, tenant) -> list:
    """The same puts for either path; returns what each answered."""
    c = ids(8)
    answers = []

    def put(body, token=None):
        try:
            answers.append(("ok", graph_put(writer, tenant, body, token=token)))
        except (ThreadConflict, Fenced) as exc:
            answers.append((type(exc).__name__, str(exc)))

    put(lg_put(THREAD, c[0], values={"n": 0}))                          # first: ORM
    put(lg_put(THREAD, c[1], parent=c[0], identity=IDENT, values={"n": 1}))
    put(lg_put(THREAD, c[2], parent=c[1], values={"n": 2}, nodes=("a",)))  # no identity
    graph_writes(writer, tenant, lg_writes(THREAD, c[2], "task-1", [(0, "n", 3)]))
    body = lg_put(THREAD, c[3], parent=c[2], values={"n": 3}, nodes=("b",),
                  metadata={"source": "loop", "step": 3, "parents": {}, "run_id": "lg-1"})
    body["interrupt_before"] = ["b"]                                     # a breakpoint
    put(body)
    put(lg_put(THREAD, c[4], values={"n": 4}, nodes=("c",)))           # append, no parent
    put(lg_put(THREAD, c[4], values={"n": 4}, nodes=("c",)))           # retry: ORM
    put(lg_put(THREAD, c[5], parent=c[2], values={"n": 5}))             # not the head: ORM
    put(lg_put(THREAD, c[5], ns="child", values={"s": 1},               # new ns: ORM
               identity={"workflow": "sub", "definition_version": "2"}))
    put(lg_put(THREAD, c[6], parent=c[5], ns="child", values={"s": 2}))  # its next
    run = services.lease_acquire(actor=writer, tenant=tenant, run_id=thread_run_id(THREAD),
                                 owner="w1", ttl_s=60)
    put(lg_put(THREAD, c[5], parent=c[4], values={"n": 5}))             # fenced: ORM
    body = lg_put(THREAD, c[5], parent=c[4], values={"n": 5})
    body["interrupt_after"] = ["c"]                      # after the parent's next node
    put(body, token=run.fencing_token)
    put(lg_put(THREAD, c[7], parent=c[5], values={"n": 6}), token=run.fencing_token + 1)
    return answers


def writes_script(writer, tenant) -> list:
    """The same puts and pending writes for either path; returns what each answered."""
    c = ids(5)
    answers = []

    def put(body, token=None):
        answers.append(("put", graph_put(writer, tenant, body, token=token)))

    def writes(checkpoint_id, task, items, token=None, ns=""):
        try:
            answers.append(("writes", graph_writes(
                writer, tenant, lg_writes(THREAD, checkpoint_id, task, items, ns=ns),
                token=token)))
        except (Fenced, NotFound) as exc:
            answers.append((type(exc).__name__, str(exc)))

    writes(c[0], "task-1", [(0, "n", 1)])                   # no thread yet: ORM, 404
    put(lg_put(THREAD, c[0], values={"n": 0}, identity=IDENT, nodes=("a", "b")))
    writes(c[0], "task-1", [(0, "n", 1), (1, "m", 2)])      # the head's first writes
    writes(c[0], "task-2", [(0, INTERRUPT, {"value": "ask"})])  # interrupted
    writes(c[0], "task-1", [(0, "n", 1)])                   # a retry: ORM, nothing stored
    writes(c[0], "task-2", [(-1, ERROR, "boom")])           # errored
    writes(c[0], "task-2", [(-1, ERROR, "boom again")])     # a special write replaced: ORM
    writes(c[0], NULL_TASK_ID, [(0, "n", 5)])               # the null task: not counted
    put(lg_put(THREAD, c[1], parent=c[0], values={"n": 1}))
    writes(c[0], "task-3", [(0, "n", 6)])                   # an older checkpoint: ORM
    writes(c[1], "task-4", [(0, "n", 7)])
    writes(c[3], "task-4", [(0, "n", 7)])                   # no such checkpoint: ORM, 404
    run = services.lease_acquire(actor=writer, tenant=tenant, run_id=thread_run_id(THREAD),
                                 owner="w1", ttl_s=60)
    writes(c[1], "task-5", [(0, "n", 8)])                   # fenced: ORM
    writes(c[1], "task-5", [(0, "n", 8)], token=run.fencing_token)
    return answers


def untimed(tables: dict) -> dict:
    """``rows`` without the envelopes' ``updated_at_ms``: a LangGraph envelope's is the
    database time of its put (``common._envelope``), which differs by nature."""
    for table in ("checkpoints", "revisions"):
        for row in tables[table]:
            row["updated_at_ms"] = row["updated_at_ms"] > 0
    return tables


def graph_rows(tenant) -> list[dict]:
    out = []
    for g in GraphCheckpoint.objects.for_tenant(tenant).order_by("checkpoint_ns",
                                                                   "checkpoint_id"):
        row = {}
        for f in g._meta.concrete_fields:
            if f.name in SKIP or f.attname in SKIP or f.name == "envelope":
                continue
            value = getattr(g, f.attname)
            row[f.name] = (value is not None) if f.name in TIMES else value
        row["checkpoint_ciphertext"] = crypto.decrypt_text(g.checkpoint_ciphertext)
        row["metadata_ciphertext"] = crypto.decrypt_text(g.metadata_ciphertext)
        row["envelope"] = (str(g.envelope.uuid), g.envelope_revision)
        row["by"] = g.written_by.username[:1]
        out.append(row)
    return out


def test_the_sql_path_writes_what_the_orm_path_writes(acme, globex, wendy, wes, settings,
                                                      sql_puts):
    # Written: c1, c2, c3, c4, the child's second, the leased put. Handed back: the
    # first put, the retry, the stale parent, the child's first, both fenced tokens.
    fast, fast_rows = run_twice(settings, sql_puts, script, (acme, wendy), (globex, wes),
                                written=6, handed_back=6)
    assert [a[0] for a in fast] == ["ok"] * 6 + ["ThreadConflict", "ok", "ok", "Fenced",
                                                 "ok", "Fenced"]
    summary = [r["payload_ciphertext"] for r in fast_rows["revisions"]]
    # Both breakpoint hints reached the summaries (the parent's next read from the
    # envelope for "after").
    assert any('"when":"before"' in s for s in summary)
    assert any('"when":"after"' in s for s in summary)


def run_twice(settings, calls: dict, script, fast: tuple, slow: tuple, *, written: int,
              handed_back: int) -> tuple[list, dict]:
    """``script`` on ``fast`` (tenant, writer) with the SQL path, then on ``slow`` with
    ``RECOVERY_SQL_WRITE_PATH`` off; checks that the SQL path (counted in ``calls``) wrote
    ``written`` times and handed back ``handed_back``, that both answered the same and
    left the same rows, and that the fast tenant's audit verifies. Returns the answers
    and the fast tenant's rows (``untimed(rows(...))``)."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    answers = script(fast[1], fast[0])
    assert calls == {"written": written, "fallback": handed_back}
    settings.RECOVERY_SQL_WRITE_PATH = False
    assert script(slow[1], slow[0]) == answers
    assert calls == {"written": written, "fallback": handed_back}  # never tried on slow
    fast_rows, slow_rows = untimed(rows(fast[0])), untimed(rows(slow[0]))
    for table in fast_rows:
        assert fast_rows[table] == slow_rows[table], table
    assert graph_rows(fast[0]) == graph_rows(slow[0])
    assert services.audit_verify(tenant=fast[0])[0]
    return answers, fast_rows


def write_rows(tenant) -> list[tuple]:
    return [(w.graph_checkpoint.checkpoint_id, w.task_id, w.task_path, w.idx, w.channel,
             crypto.decrypt_text(w.value_ciphertext), w.value_size, w.created_at is not None)
            for w in GraphWrite.objects.for_tenant(tenant).order_by(
                "graph_checkpoint__checkpoint_id", "task_id", "idx")]


def test_the_sql_path_stores_writes_as_the_orm_path_does(acme, globex, wendy, wes, settings,
                                                         sql_writes):
    # Written: the head's first writes, the interrupt, the error, the null task's, the
    # next head's, the leased one. Handed back: the 404s, the retry, the replacement,
    # the older checkpoint's, the fenced one.
    fast, fast_rows = run_twice(settings, sql_writes, writes_script, (acme, wendy),
                                (globex, wes), written=6, handed_back=6)
    assert [a[0] for a in fast].count("NotFound") == 2
    assert [a[0] for a in fast].count("Fenced") == 1
    assert write_rows(acme) == write_rows(globex)
    summaries = [r["payload_ciphertext"] for r in fast_rows["revisions"]]
    assert any('"interrupted":true' in s and '"errored":true' in s for s in summaries)


def test_writes_on_the_head_are_two_round_trips(acme, wendy, settings, sql_writes):
    """BEGIN + the lock + the head, its writes and the envelope read, then the envelope's
    compare-and-swap + history + run + audit event + the writes' rows + COMMIT."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(1)
    graph_put(wendy, acme, lg_put(THREAD, c[0], values={"n": 0}, nodes=("a",)))
    counts = [round_trips(connection.connection, lambda i=i: graph_writes(
        wendy, acme, lg_writes(THREAD, c[0], f"task-{i}", [(0, "n", i), (1, "m", i)])))
        for i in range(3)]
    assert counts == [2, 2, 2]
    assert sql_writes["written"] == 3
    assert GraphWrite.objects.for_tenant(acme).count() == 6


def test_the_next_checkpoint_is_two_round_trips(acme, wendy, settings, sql_puts):
    """BEGIN + the lock + the head and envelope read, then the envelope's compare-and-swap
    + history + run + audit event + the LangGraph row + COMMIT: the 2nd and the 40th
    put alike (issue 22, item 3: about 16 waits before)."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    c = ids(41)
    graph_put(wendy, acme, lg_put(THREAD, c[0], values={"n": 0}))
    counts = []
    for i in range(1, 41):
        body = lg_put(THREAD, c[i], parent=c[i - 1], values={"n": i})
        if i in (1, 40):
            counts.append(round_trips(connection.connection,
                                      lambda b=body: graph_put(wendy, acme, b)))
        else:
            graph_put(wendy, acme, body)
    assert counts == [2, 2]
    assert sql_puts["written"] == 40
    assert GraphCheckpoint.objects.for_tenant(acme).count() == 41
