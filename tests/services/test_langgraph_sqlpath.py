"""The LangGraph put's SQL path (``interop.langgraph.put._put_sql``, PostgreSQL) writes
exactly what its ORM path (the reference, and SQLite's only path) writes (issue 22,
item 3: ``RecoverySaver.put`` in two round trips).

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
from checkpoints.exceptions import Fenced, ThreadConflict
from checkpoints.interop.langgraph import put as put_module
from checkpoints.models import GraphCheckpoint
from checkpoints.sql import FALLBACK
from recovery_client.protocol import thread_run_id
from tests.helpers import graph_put, graph_writes, lg_put, lg_writes
from tests.services.test_langgraph import IDENT, ids
from tests.services.test_writepath import SKIP, TIMES, round_trips, rows

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREAD = "thread-sqlpath"


@pytest.fixture
def sql_puts(monkeypatch):
    """Counts the puts the SQL path wrote (so the comparison cannot pass by both tenants
    taking the ORM path) and those it handed back."""
    calls = {"written": 0, "fallback": 0}
    real = put_module._put_sql

    def counting(*args, **kwargs):
        answer = real(*args, **kwargs)
        calls["fallback" if answer is FALLBACK else "written"] += 1
        return answer

    monkeypatch.setattr(put_module, "_put_sql", counting)
    return calls


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
    settings.RECOVERY_SQL_WRITE_PATH = True
    fast = script(wendy, acme)
    # Written: c1, c2, c3, c4, the child's second, the leased put. Handed back: the
    # first put, the retry, the stale parent, the child's first, both fenced tokens.
    assert sql_puts == {"written": 6, "fallback": 6}
    settings.RECOVERY_SQL_WRITE_PATH = False
    slow = script(wes, globex)
    assert sql_puts == {"written": 6, "fallback": 6}  # globex never tried it
    assert fast == slow
    assert [a[0] for a in fast] == ["ok"] * 6 + ["ThreadConflict", "ok", "ok", "Fenced",
                                                 "ok", "Fenced"]
    fast_rows, slow_rows = untimed(rows(acme)), untimed(rows(globex))
    for table in fast_rows:
        assert fast_rows[table] == slow_rows[table], table
    assert graph_rows(acme) == graph_rows(globex)
    summary = [r["payload_ciphertext"] for r in fast_rows["revisions"]]
    # Both breakpoint hints reached the summaries (the parent's next read from the
    # envelope for "after").
    assert any('"when":"before"' in s for s in summary)
    assert any('"when":"after"' in s for s in summary)
    assert services.audit_verify(tenant=acme)[0]


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
