"""LangGraph threads on recovery, the server half (issue 10, docs/langgraph.md "Server"):
``interop.langgraph`` through the services, on SQLite and PostgreSQL.

A thread is one run, a (thread, namespace) one envelope whose revisions summarise the
head; a put continues from the head or is refused and kept as a conflict; pending
writes move the phase; deleting, pruning and copying keep the envelope, the run and the
audit trail true; a crashed graph becomes ambiguous like any other run.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import crypto, kinds, services
from checkpoints.exceptions import Fenced, InvalidPayload, NotFound, ThreadConflict
from checkpoints.interop import langgraph
from checkpoints.interop.langgraph import next_nodes, reads
from checkpoints.jsonparse import loads_any
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    GraphCheckpoint,
    GraphWrite,
    Run,
)
from recovery_client.protocol import thread_checkpoint_id, thread_run_id
from tests.helpers import (
    effect_body,
    graph_put,
    graph_writes,
    lg_checkpoint,
    lg_put,
    lg_writes,
    put_effect,
    sweep_later,
    typed,
)
from tests.matrixhelpers import db_diff, db_state

pytestmark = pytest.mark.django_db

IDENT = {"workflow": "refund", "definition_version": "1"}


def ids(n: int) -> list[str]:
    """``n`` checkpoint ids that grow, as LangGraph's uuid6 ids do."""
    return [f"1f0c3a2e-{i:04x}-6000-8000-000000000000" for i in range(n)]


def chain(writer, tenant, thread: str, n: int, *, ns: str = "", **kw) -> list[str]:
    """``n`` checkpoints, each the parent of the next; returns their ids."""
    out, parent = ids(n), None
    for cid in out:
        graph_put(writer, tenant, lg_put(thread, cid, parent=parent, ns=ns, **kw))
        parent = cid
    return out


def envelope_of(tenant, thread: str, ns: str = "") -> Checkpoint:
    return Checkpoint.objects.get(tenant=tenant, uuid=thread_checkpoint_id(thread, ns))


def summary(tenant, thread: str, ns: str = "") -> dict:
    return loads_any(crypto.decrypt_text(envelope_of(tenant, thread, ns).payload_ciphertext))


def listed(writer, tenant, **kw) -> list[str]:
    return [t["checkpoint_id"] for t in langgraph.graph_list(actor=writer, tenant=tenant, **kw)[0]]


# --------------------------------------------------------------------------------------
# The mapping
# --------------------------------------------------------------------------------------

def test_a_thread_is_one_run_and_each_namespace_one_envelope(acme, wendy):
    first = graph_put(wendy, acme, lg_put("t-1", "01", nodes=["charge"], identity=IDENT))
    graph_put(wendy, acme, lg_put("t-1", "01", ns="child:1"))
    assert first == {"thread_id": "t-1", "checkpoint_ns": "", "checkpoint_id": "01",
                     "run_id": str(thread_run_id("t-1")), "revision": 0}
    run = Run.objects.get()
    assert run.uuid == thread_run_id("t-1")
    assert {c.uuid for c in Checkpoint.objects.all()} == {
        thread_checkpoint_id("t-1", ""), thread_checkpoint_id("t-1", "child:1")}
    root = envelope_of(acme, "t-1")
    assert (root.kind, root.schema_version, root.phase_class) == (
        "langgraph.checkpoint", 1, "in_flight")
    assert root.phase_label == "running charge (0/1 tasks written)"
    assert summary(acme, "t-1") == {
        "thread_id": "t-1", "checkpoint_ns": "", "checkpoint_id": "01",
        "parent_checkpoint_id": None, "step": 1, "source": "loop", "next": ["charge"],
        "tasks": 1, "written_tasks": 0, "interrupted": False, "errored": False,
        "identity": IDENT}
    assert (run.workflow, run.definition_version) == ("refund", "1")


def test_the_same_thread_id_in_two_tenants_is_two_runs(acme, wendy, globex, wes):
    graph_put(wendy, acme, lg_put("t-1", "01"))
    graph_put(wes, globex, lg_put("t-1", "01", nodes=["other"]))
    assert Run.objects.filter(uuid=thread_run_id("t-1")).count() == 2
    assert listed(wendy, acme, thread_id="t-1") == ["01"]
    (mine,) = langgraph.graph_list(actor=wes, tenant=globex, thread_id="t-1")[0]
    assert "branch:to:other" in mine["checkpoint"]["channel_values"]


def test_payloads_are_encrypted_and_the_envelope_holds_no_channel_value(acme, wendy):
    graph_put(wendy, acme, lg_put("t-1", "01", values={"secret": "card 4242"},
                                  metadata={"source": "loop", "step": 0, "note": "vip"}))
    row = GraphCheckpoint.objects.get()
    assert "4242" not in row.checkpoint_ciphertext and "vip" not in row.metadata_ciphertext
    assert typed("card 4242")["b64"] not in envelope_of(acme, "t-1").payload_ciphertext
    assert typed("card 4242")["b64"] not in crypto.decrypt_text(
        envelope_of(acme, "t-1").payload_ciphertext)


def test_identity_carries_over_from_the_previous_put_unless_given(acme, wendy):
    graph_put(wendy, acme, lg_put("t-1", "01", identity=IDENT))
    graph_put(wendy, acme, lg_put("t-1", "02", parent="01"))
    assert summary(acme, "t-1")["identity"] == IDENT
    graph_put(wendy, acme, lg_put("t-1", "03", parent="02", identity={"agent": "bot"}))
    assert Run.objects.get().agent == "bot" and Run.objects.get().workflow == ""


@pytest.mark.parametrize(("checkpoint", "expected"), [
    ({"values": {"__start__": {"x": 1}}}, ["__start__"]),
    ({"nodes": ["b", "a"]}, ["a", "b"]),
    ({"done": ["a"]}, []),
    ({"nodes": ["a"], "versions": {"branch:to:a": "00000000000000000000000000000010.0.5"},
      "seen": {"a": {"branch:to:a": "00000000000000000000000000000009.0.9"}}}, ["a"]),
    ({"nodes": ["a"], "versions": {"branch:to:a": "00000000000000000000000000000010.0.5"},
      "seen": {"a": {"branch:to:a": "00000000000000000000000000000010.0.5"}}}, []),
    ({"nodes": ["a"], "versions": {"branch:to:a": 10}, "seen": {"a": {"branch:to:a": 9}}},
     ["a"]),
    ({"nodes": ["a"], "versions": {"branch:to:a": 10}, "seen": {"a": {"branch:to:a": 10}}},
     []),
    ({"values": {"messages": ["hi"]}}, []),  # a state channel triggers no node by itself
])
def test_next_nodes_follow_langgraphs_trigger_rule(checkpoint, expected):
    body = lg_put("t", "01", **checkpoint)
    assert next_nodes(langgraph.parse_put(body).checkpoint) == expected


def test_a_channel_missing_from_channel_versions_is_not_stored(acme, wendy):
    body = lg_put("t-1", "01", values={"a": 1, "b": 2})
    del body["checkpoint"]["channel_versions"]["b"]
    graph_put(wendy, acme, body)
    (tup,) = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    assert set(tup["checkpoint"]["channel_values"]) == {"a"}


# --------------------------------------------------------------------------------------
# Compare-and-swap on the head
# --------------------------------------------------------------------------------------

def test_each_put_from_the_head_writes_one_envelope_revision(acme, wendy):
    a, b, c = chain(wendy, acme, "t-1", 3)
    env = envelope_of(acme, "t-1")
    assert env.revision == 2
    assert list(CheckpointRevision.objects.filter(checkpoint=env)
                .values_list("revision", flat=True)) == [0, 1, 2]
    assert list(GraphCheckpoint.objects.order_by("checkpoint_id")
                .values_list("envelope_revision", "parent_checkpoint_id")) == [
        (0, ""), (1, a), (2, b)]
    assert AuditEvent.objects.filter(action="checkpoint.write").count() == 3


def test_a_put_whose_parent_is_not_the_head_is_refused_and_kept_as_a_conflict(acme, wendy):
    a, b = chain(wendy, acme, "t-1", 2)
    before = db_state()
    with pytest.raises(ThreadConflict) as refused:
        graph_put(wendy, acme, lg_put("t-1", ids(3)[2], parent=a))
    assert refused.value.body() == {
        "error": "conflict", "current_revision": 1, "head_checkpoint_id": b,
        "detail": f"parent_checkpoint_id: not the head of the thread's namespace (the head "
                  f"is {b})"}
    conflict = Conflict.objects.get()
    assert (conflict.reason, conflict.target_uuid) == ("stale_revision",
                                                       thread_checkpoint_id("t-1", ""))
    # Through checkpoint_put's compare-and-swap: from the revision the parent was written at.
    assert (conflict.expected_revision, conflict.actual_revision,
            conflict.attempted_revision) == (0, 1, 1)
    refused_body = loads_any(crypto.decrypt_text(conflict.refused_ciphertext))
    assert refused_body["payload"]["checkpoint_id"] == ids(3)[2]
    changed = db_diff(before, db_state())
    assert set(changed) == {"checkpoints.Conflict", "checkpoints.AuditEvent",
                            "checkpoints.AuditPending", "checkpoints.Run",
                            "checkpoints.RunTransition", "checkpoints.RunStateCount",
                            "checkpoints.NotificationOutbox",  # conflicted: a person acts
                            "checkpoints.ReportCount"}  # the report's count of conflicts
    assert changed["checkpoints.Run"] == {"changed": [Run.objects.get().pk]}
    run = Run.objects.get()
    assert (run.unacknowledged_conflicts, run.recovery_state) == (1, "conflicted")
    assert AuditEvent.objects.filter(action="checkpoint.conflict").count() == 1


def test_two_graphs_resuming_one_thread_one_after_the_other_make_no_fork(acme, wendy):
    """The race of the issue, single-threaded (the PostgreSQL race is in
    tests/transactional/test_langgraph_races.py): both resume from the head; the first
    put wins, the second is a 412 and a conflict; history stays one chain."""
    (head,) = chain(wendy, acme, "t-1", 1)
    mine, theirs = ids(3)[1], ids(3)[2]
    graph_put(wendy, acme, lg_put("t-1", mine, parent=head))
    with pytest.raises(ThreadConflict):
        graph_put(wendy, acme, lg_put("t-1", theirs, parent=head))
    rows = list(GraphCheckpoint.objects.order_by("checkpoint_id")
                .values_list("checkpoint_id", "parent_checkpoint_id"))
    assert rows == [(head, ""), (mine, head)]
    assert Conflict.objects.count() == 1


def test_a_parent_that_was_never_stored_is_a_conflict_too(acme, wendy):
    (head,) = chain(wendy, acme, "t-1", 1)
    with pytest.raises(ThreadConflict) as refused:
        graph_put(wendy, acme, lg_put("t-1", "9", parent="ghost"))
    assert refused.value.current_revision == 0
    assert Conflict.objects.get().expected_revision is None


def test_a_parent_on_an_empty_namespace_is_refused_without_a_run_to_keep_it(acme, wendy):
    before = db_state()
    with pytest.raises(ThreadConflict) as refused:
        graph_put(wendy, acme, lg_put("t-new", "01", parent="00"))
    assert (refused.value.current_revision, refused.value.head_checkpoint_id) == (None, None)
    assert db_diff(before, db_state()) == {}  # no run made for a refusal
    graph_put(wendy, acme, lg_put("t-new", "01", ns="child"))
    with pytest.raises(ThreadConflict):  # the run exists now: the conflict is kept on it
        graph_put(wendy, acme, lg_put("t-new", "01", parent="00"))
    assert Conflict.objects.filter(run__uuid=thread_run_id("t-new")).count() == 1


def test_a_put_without_parent_is_appended_after_the_head(acme, wendy):
    a, b = ids(2)
    graph_put(wendy, acme, lg_put("t-1", a))
    answer = graph_put(wendy, acme, lg_put("t-1", b))
    assert answer["revision"] == 1
    assert listed(wendy, acme, thread_id="t-1") == [b, a]


def test_an_id_that_does_not_sort_after_the_head_is_refused(acme, wendy):
    a, b = ids(2)
    graph_put(wendy, acme, lg_put("t-1", b))
    with pytest.raises(ThreadConflict) as refused:
        graph_put(wendy, acme, lg_put("t-1", a, parent=b))
    assert "must sort after the head's id" in refused.value.detail
    assert Conflict.objects.count() == 1


def test_the_same_put_again_answers_the_first_and_writes_nothing(acme, wendy):
    a, b = ids(2)
    graph_put(wendy, acme, lg_put("t-1", a))
    first = graph_put(wendy, acme, lg_put("t-1", b, parent=a))
    graph_writes(wendy, acme, lg_writes("t-1", b, "task", [(0, "x", 1)]))
    before = db_state()
    again, created = langgraph.graph_put(actor=wendy, tenant=acme,
                                         put=langgraph.parse_put(lg_put("t-1", b, parent=a)))
    assert (again, created) == (first, False)
    assert db_diff(before, db_state()) == {}


def test_the_same_id_with_other_content_is_a_conflict(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1)
    with pytest.raises(ThreadConflict) as refused:
        graph_put(wendy, acme, lg_put("t-1", a, values={"x": "different"}))
    assert "other content" in refused.value.detail
    assert Conflict.objects.get().reason == "id_exists"


def test_a_write_after_an_owner_took_the_lease_needs_its_fencing_token(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1)
    lease = services.lease_acquire(actor=wendy, tenant=acme, run_id=thread_run_id("t-1"),
                                   owner="graph-1", ttl_s=60)
    with pytest.raises(Fenced):
        graph_put(wendy, acme, lg_put("t-1", "1f1", parent=a))
    with pytest.raises(Fenced):
        graph_writes(wendy, acme, lg_writes("t-1", a, "task", [(0, "x", 1)]))
    assert list(Conflict.objects.values_list("reason", "fencing_token_sent")) == [
        ("fenced", None), ("fenced", None)]
    assert GraphWrite.objects.count() == 0 and GraphCheckpoint.objects.count() == 1
    graph_put(wendy, acme, lg_put("t-1", "1f1", parent=a), token=lease.fencing_token)
    with pytest.raises(Fenced):  # an old token, after a new owner
        graph_writes(wendy, acme, lg_writes("t-1", "1f1", "task", [(0, "x", 1)]),
                     token=lease.fencing_token - 1)


# --------------------------------------------------------------------------------------
# Pending writes
# --------------------------------------------------------------------------------------

def test_writes_on_the_head_move_the_phase(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1, nodes=["charge", "notify"])
    assert envelope_of(acme, "t-1").phase_label == "running charge, notify (0/2 tasks written)"
    assert graph_writes(wendy, acme, lg_writes("t-1", a, "t-charge", [(0, "x", 1)])) == 1
    env = envelope_of(acme, "t-1")
    assert (env.revision, env.phase_class) == (1, "in_flight")
    assert env.phase_label == "running charge, notify (1/2 tasks written)"
    graph_writes(wendy, acme, lg_writes("t-1", a, "t-notify", [(0, "y", 2)]))
    env = envelope_of(acme, "t-1")
    assert (env.phase_class, env.phase_label) == ("stable", "between steps")
    assert Run.objects.get().phase_label == "between steps"


@pytest.mark.parametrize(("channel", "label"), [
    ("__interrupt__", "waiting for input at approve"), ("__error__", "error in approve")])
def test_an_interrupt_or_error_write_makes_the_head_stable(acme, wendy, channel, label):
    (a,) = chain(wendy, acme, "t-1", 1, nodes=["approve"])
    graph_writes(wendy, acme, lg_writes("t-1", a, "t-approve", [(-3, channel, "why")]))
    env = envelope_of(acme, "t-1")
    assert (env.phase_class, env.phase_label) == ("stable", label)


def test_the_null_task_does_not_count_as_a_task_written(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1, nodes=["charge"])
    graph_writes(wendy, acme, lg_writes("t-1", a, "00000000-0000-0000-0000-000000000000",
                                        [(0, "x", 1)]))
    assert envelope_of(acme, "t-1").phase_class == "in_flight"


def _paused_put(cid, *, parent=None, interrupt_before=None, interrupt_after=None, **kw):
    """A put body carrying the graph's static breakpoints (as the saver sends them)."""
    body = lg_put("t-1", cid, parent=parent, **kw)
    for key, value in (("interrupt_before", interrupt_before),
                       ("interrupt_after", interrupt_after)):
        if value is not None:
            body[key] = value
    return body


def test_a_checkpoint_at_a_static_breakpoint_is_paused_not_in_flight(acme, wendy):
    """Issue 17 item 2: LangGraph writes nothing when it stops at ``interrupt_before``;
    given the graph's breakpoints, the server applies LangGraph's ``should_interrupt``:
    a breakpoint node next and a channel newer than ``versions_seen["__interrupt__"]``."""
    graph_put(wendy, acme, _paused_put("01", nodes=["charge"], interrupt_before=["charge"]))
    env = envelope_of(acme, "t-1")
    assert (env.phase_class, env.phase_label) == ("stable", "paused before charge")
    assert summary(acme, "t-1")["breakpoint"] == {"when": "before", "nodes": ["charge"]}
    # Resumed: the charge task wrote, so it is a step like any other.
    graph_writes(wendy, acme, lg_writes("t-1", "01", "t-charge", [(0, "x", 1)]))
    assert envelope_of(acme, "t-1").phase_label == "between steps"
    # The next checkpoint saw every channel at the breakpoint (a resume went past it):
    # not paused again, though the next node is a breakpoint.
    body = _paused_put("02", parent="01", nodes=["charge"], interrupt_before=["charge"])
    body["checkpoint"]["versions_seen"]["__interrupt__"] = dict(
        body["checkpoint"]["channel_versions"])
    graph_put(wendy, acme, body)
    assert envelope_of(acme, "t-1").phase_class == "in_flight"
    assert "breakpoint" not in summary(acme, "t-1")


@pytest.mark.parametrize(("breakpoints", "label"), [
    ({"interrupt_before": "*"}, "paused before ship"),
    ({"interrupt_after": ["charge"]}, "paused after charge"),
    ({"interrupt_after": "*"}, "paused after charge"),
    ({"interrupt_before": ["other"], "interrupt_after": ["other"]}, "running ship"),
    ({}, "running ship"),
])
def test_interrupt_after_looks_at_the_tasks_that_just_ran(acme, wendy, breakpoints, label):
    graph_put(wendy, acme, lg_put("t-1", "01", nodes=["charge"]))
    graph_put(wendy, acme, _paused_put("02", parent="01", nodes=["ship"], done=["charge"],
                                       **breakpoints))
    assert envelope_of(acme, "t-1").phase_label.startswith(label)


@pytest.mark.parametrize(("sends", "values", "label"), [
    (3, {"__pregel_tasks": ["s1", "s2", "s3"]}, "running sent tasks (0/3 tasks written)"),
    (0, {"__pregel_tasks": []}, "done"),  # an emptied channel still holds a value
    (None, {"__pregel_tasks": []}, "running sent tasks (0/1 tasks written)"),  # an old saver
])
def test_pending_sends_are_counted_by_the_saver(acme, wendy, sends, values, label):
    body = lg_put("t-1", "01", values=values)
    if sends is not None:
        body["sends"] = sends
    graph_put(wendy, acme, body)
    assert envelope_of(acme, "t-1").phase_label == label


def test_a_repeated_write_is_kept_and_a_special_one_replaced(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1, nodes=["n"])
    graph_writes(wendy, acme, lg_writes("t-1", a, "task", [(0, "x", "first"),
                                                           (-1, "__error__", "boom")]))
    revision = envelope_of(acme, "t-1").revision
    before = db_state()
    assert graph_writes(wendy, acme, lg_writes("t-1", a, "task", [(0, "x", "first")])) == 0
    assert db_diff(before, db_state()) == {}  # a retry writes nothing, audits nothing
    assert graph_writes(wendy, acme, lg_writes("t-1", a, "task", [(0, "x", "second"),
                                                                  (-1, "__error__", "again")])) == 1
    (tup,) = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    assert [(w["idx"], w["value"]) for w in tup["pending_writes"]] == [
        (-1, typed("again")), (0, typed("first"))]
    assert envelope_of(acme, "t-1").revision == revision + 1


def test_writes_follow_langgraphs_savers_write_by_write(acme, wendy):
    """Issue 17 item 2: a node that interrupts twice is resumed twice. Its second resume
    sends ``__resume__`` twice in one call (the answers it consumed so far, then all of
    them) beside its state write: each special (negative) idx keeps its last write and
    replaces what was stored; a plain (non-negative) idx is insert-if-absent, in one call
    as across calls, whatever else the call carries (``InMemorySaver.put_writes``)."""
    from langgraph.checkpoint.base import WRITES_IDX_MAP

    resume, interrupt = WRITES_IDX_MAP["__resume__"], WRITES_IDX_MAP["__interrupt__"]
    (a,) = chain(wendy, acme, "t-1", 1, nodes=["ask"])
    graph_writes(wendy, acme, lg_writes("t-1", a, "ask", [(interrupt, "__interrupt__", "1st?")]))
    graph_writes(wendy, acme, lg_writes("t-1", a, "ask", [(interrupt, "__interrupt__", "2nd?"),
                                                          (resume, "__resume__", ["x"])]))
    assert graph_writes(wendy, acme, lg_writes("t-1", a, "ask", [
        (resume, "__resume__", ["x"]), (resume, "__resume__", ["x", "y"]),
        (0, "log", "xy")])) == 2  # one __resume__ row replaced, one row inserted
    (tup,) = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    assert [(w["idx"], w["channel"], w["value"]) for w in tup["pending_writes"]] == [
        (resume, "__resume__", typed(["x", "y"])), (interrupt, "__interrupt__", typed("2nd?")),
        (0, "log", typed("xy"))]
    # A plain idx already stored is kept, even beside special writes in the same call.
    graph_writes(wendy, acme, lg_writes("t-1", a, "ask", [(0, "log", "other"),
                                                          (resume, "__resume__", ["z"])]))
    (tup,) = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    assert [(w["idx"], w["value"]) for w in tup["pending_writes"]] == [
        (resume, typed(["z"])), (interrupt, typed("2nd?")), (0, typed("xy"))]
    assert GraphWrite.objects.count() == 3


def test_writes_on_an_older_checkpoint_leave_the_envelope_and_are_audited(acme, wendy):
    """A put_writes arriving after the next put (LangGraph saves in the background) is
    stored on its checkpoint, makes no conflict and no envelope revision."""
    a, b = chain(wendy, acme, "t-1", 2)
    revision = envelope_of(acme, "t-1").revision
    assert graph_writes(wendy, acme, lg_writes("t-1", a, "late", [(0, "x", 1)])) == 1
    assert envelope_of(acme, "t-1").revision == revision
    assert Conflict.objects.count() == 0
    event = AuditEvent.objects.get(action="langgraph.writes")
    assert event.after == {"checkpoint_id": a, "task_id": "late", "stored": 1}


def test_writes_for_a_checkpoint_that_does_not_exist_are_404(acme, wendy):
    with pytest.raises(NotFound):
        graph_writes(wendy, acme, lg_writes("nobody", "01", "task", [(0, "x", 1)]))
    chain(wendy, acme, "t-1", 1)
    for thread, ns, cid in (("t-1", "", "ghost"), ("t-1", "other-ns", ids(1)[0])):
        with pytest.raises(NotFound):
            graph_writes(wendy, acme, lg_writes(thread, cid, "task", [(0, "x", 1)], ns=ns))


# --------------------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------------------

def test_it_lists_newest_first_with_before_limit_and_next_before(acme, wendy):
    a, b, c, d = chain(wendy, acme, "t-1", 4)
    assert listed(wendy, acme, thread_id="t-1") == [d, c, b, a]
    page, nxt = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1", limit=2)
    assert ([t["checkpoint_id"] for t in page], nxt) == ([d, c], c)
    page, nxt = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1", before=nxt,
                                     limit=2)
    assert ([t["checkpoint_id"] for t in page], nxt) == ([b, a], None)
    assert listed(wendy, acme, thread_id="t-1", checkpoint_id=b) == [b]
    assert listed(wendy, acme, thread_id="t-1", checkpoint_id="ghost") == []


def test_it_lists_by_namespace_or_every_namespace(acme, wendy):
    (root,) = chain(wendy, acme, "t-1", 1)
    graph_put(wendy, acme, lg_put("t-1", "2", ns="child:1"))
    assert listed(wendy, acme, thread_id="t-1", checkpoint_ns="") == [root]
    assert listed(wendy, acme, thread_id="t-1", checkpoint_ns="child:1") == ["2"]
    assert sorted(listed(wendy, acme, thread_id="t-1")) == sorted([root, "2"])


def test_it_filters_on_metadata_by_json_equality(acme, wendy):
    a, b, c = ids(3)
    graph_put(wendy, acme, lg_put("t-1", a, metadata={"source": "input", "step": 1}))
    graph_put(wendy, acme, lg_put("t-1", b, metadata={"source": "loop", "step": 1.0,
                                                      "score": True}))
    graph_put(wendy, acme, lg_put("t-1", c, metadata={"source": "loop", "step": 2,
                                                      "score": 1, "tags": {"x": [1]}}))
    assert listed(wendy, acme, thread_id="t-1", metadata_filter={"source": "loop"}) == [c, b]
    assert listed(wendy, acme, thread_id="t-1", metadata_filter={"step": 1}) == [b, a]
    assert listed(wendy, acme, thread_id="t-1", metadata_filter={"score": True}) == [b]
    assert listed(wendy, acme, thread_id="t-1", metadata_filter={"score": 1}) == [c]
    assert listed(wendy, acme, metadata_filter={"tags": {"x": [1]}}) == [c]
    assert listed(wendy, acme, metadata_filter={"source": "loop", "step": 2}) == [c]
    assert listed(wendy, acme, metadata_filter={"missing": None}) == []


def test_a_filtered_page_reads_a_bounded_number_of_checkpoints(acme, wendy, monkeypatch):
    monkeypatch.setattr(reads, "FILTER_SCAN_MAX", 2)
    monkeypatch.setattr(reads, "_SCAN_BATCH", 2)
    a, b, c, d, e = ids(5)
    for cid, source in ((a, "hit"), (b, "miss"), (c, "miss"), (d, "miss"), (e, "hit")):
        graph_put(wendy, acme, lg_put("t-1", cid, metadata={"source": source}))
    found, before = [], None
    pages = 0
    while True:
        page, before = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1",
                                            before=before, metadata_filter={"source": "hit"})
        pages += 1
        found += [t["checkpoint_id"] for t in page]
        if before is None:
            break
    assert found == [e, a] and pages == 3  # pages of at most two checkpoints read


def test_a_page_never_splits_checkpoints_that_share_an_id(acme, wendy):
    a, b = chain(wendy, acme, "t-1", 2)
    langgraph.graph_thread_copy(actor=wendy, tenant=acme, source_thread_id="t-1",
                                target_thread_id="t-2")
    page, nxt = langgraph.graph_list(actor=wendy, tenant=acme, limit=3)
    assert [(t["thread_id"], t["checkpoint_id"]) for t in page] == [("t-1", b), ("t-2", b)]
    assert nxt == b
    page, nxt = langgraph.graph_list(actor=wendy, tenant=acme, limit=1, before=nxt)
    assert [(t["thread_id"], t["checkpoint_id"]) for t in page] == [("t-1", a), ("t-2", a)]
    assert nxt is None  # a group larger than the limit comes whole


def test_a_page_is_bounded_in_bytes(acme, wendy):
    a, b, c = chain(wendy, acme, "t-1", 3, values={"blob": "x" * 2000})
    one = GraphCheckpoint.objects.get(checkpoint_id=c).payload_size
    page, nxt = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1",
                                     max_bytes=int(2.5 * one))
    assert [t["checkpoint_id"] for t in page] == [c, b] and nxt == b
    page, nxt = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1", max_bytes=10)
    assert [t["checkpoint_id"] for t in page] == [c]  # at least one


def test_pending_writes_come_with_their_checkpoint_in_task_path_order(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1, nodes=["x", "y"])
    graph_writes(wendy, acme, lg_writes("t-1", a, "task-b", [(1, "c2", 2), (0, "c1", 1)],
                                        task_path="~0"))
    graph_writes(wendy, acme, lg_writes("t-1", a, "task-a", [(0, "c3", 3)], task_path="~1"))
    (tup,) = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    assert tup["pending_writes"] == [
        {"task_id": "task-b", "channel": "c1", "value": typed(1), "idx": 0},
        {"task_id": "task-b", "channel": "c2", "value": typed(2), "idx": 1},
        {"task_id": "task-a", "channel": "c3", "value": typed(3), "idx": 0}]
    assert tup["parent_checkpoint_id"] is None
    assert tup["run_id"] == str(thread_run_id("t-1"))
    assert tup["checkpoint"] == lg_checkpoint(a, values={"branch:to:x": None,
                                                         "branch:to:y": None},
                                              versions={"branch:to:x": 2, "branch:to:y": 2})


def test_a_list_reads_each_page_in_a_fixed_number_of_queries(acme, wendy):
    """No query per tuple (the writes of the page in one query): pages of 2 and of 20
    checkpoints with writes cost the same number of queries."""
    for thread in ("few", "many"):
        n = 2 if thread == "few" else 20
        for cid in chain(wendy, acme, thread, n, nodes=["n"]):
            graph_writes(wendy, acme, lg_writes(thread, cid, "task", [(0, "x", 1), (1, "y", 2)]))
    counts = {}
    for thread in ("few", "many"):
        with CaptureQueriesContext(connection) as queries:
            page, _ = langgraph.graph_list(actor=wendy, tenant=acme, thread_id=thread)
        counts[thread] = len(queries)
        assert all(len(t["pending_writes"]) == 2 for t in page)
    assert counts["few"] == counts["many"]


def test_a_list_audits_one_payload_read_per_namespace_answered(acme, wendy):
    chain(wendy, acme, "t-1", 3)
    chain(wendy, acme, "t-1", 2, ns="child")
    events = AuditEvent.objects.count()
    langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")
    reads = AuditEvent.objects.filter(action="payload.read")
    assert AuditEvent.objects.count() == events + 2
    assert sorted(e.after["graph_checkpoints"] for e in reads) == [2, 3]
    assert {e.target_ref for e in reads} == {str(thread_checkpoint_id("t-1", "")),
                                             str(thread_checkpoint_id("t-1", "child"))}
    before = AuditEvent.objects.count()
    assert langgraph.graph_list(actor=wendy, tenant=acme, thread_id="nobody") == ([], None)
    assert AuditEvent.objects.count() == before  # nothing read, nothing audited


# --------------------------------------------------------------------------------------
# Deleting, pruning, copying
# --------------------------------------------------------------------------------------

def test_deleting_a_thread_deletes_its_rows_envelopes_and_run(acme, wendy):
    (a,) = chain(wendy, acme, "t-1", 1)
    graph_writes(wendy, acme, lg_writes("t-1", a, "task", [(0, "x", 1)]))
    chain(wendy, acme, "t-1", 2, ns="child")
    chain(wendy, acme, "t-other", 1)
    assert langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="t-1") == 3
    assert not GraphCheckpoint.objects.filter(thread_id="t-1").exists()
    assert GraphWrite.objects.count() == 0
    assert not Run.objects.filter(uuid=thread_run_id("t-1")).exists()
    assert list(Checkpoint.objects.values_list("uuid", flat=True)) == [
        thread_checkpoint_id("t-other", "")]
    event = AuditEvent.objects.get(action="langgraph.thread_delete")
    assert event.after == {"thread_id": "t-1", "deleted": 3, "run": "deleted"}
    assert event.run_uuid == thread_run_id("t-1")
    assert listed(wendy, acme, thread_id="t-1") == []
    assert services.audit_verify(tenant=acme)[0]


def test_deleting_a_thread_keeps_its_effects_and_closes_the_run(acme, wendy):
    chain(wendy, acme, "t-1", 1, nodes=["charge"])
    put_effect(wendy, acme, effect_body(run_id=thread_run_id("t-1")))
    langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="t-1")
    run = Run.objects.get()
    assert (run.recovery_state, run.closed_reason, run.latest_checkpoint) == (
        "closed", "thread deleted", None)
    assert run.effects.count() == 1
    # The thread goes on: its next put reopens the run.
    graph_put(wendy, acme, lg_put("t-1", "2"))
    run.refresh_from_db()
    assert run.closed_at is None and run.latest_checkpoint is not None


def test_deleting_an_unknown_thread_changes_nothing(acme, wendy):
    chain(wendy, acme, "t-1", 1)
    before = db_state()
    assert langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="ghost") == 0
    assert db_diff(before, db_state()) == {}


def test_keep_latest_keeps_each_namespaces_head_and_its_writes(acme, wendy):
    *_, head = chain(wendy, acme, "t-1", 3)
    *_, child_head = chain(wendy, acme, "t-1", 2, ns="child")
    graph_writes(wendy, acme, lg_writes("t-1", head, "task", [(0, "x", 1)]))
    revision = envelope_of(acme, "t-1").revision
    assert langgraph.graph_threads_prune(actor=wendy, tenant=acme, thread_ids=["t-1", "ghost"],
                                         strategy="keep_latest") == 3
    assert sorted(listed(wendy, acme, thread_id="t-1")) == sorted([head, child_head])
    assert GraphWrite.objects.count() == 1
    assert envelope_of(acme, "t-1").revision == revision  # the head did not move
    event = AuditEvent.objects.get(action="langgraph.thread_prune")
    assert event.after == {"strategy": "keep_latest", "thread_id": "t-1", "deleted": 3,
                           "run": "kept"}
    assert langgraph.graph_threads_prune(actor=wendy, tenant=acme, thread_ids=["t-1"],
                                         strategy="delete") == 2
    assert not Run.objects.exists()


def test_deleting_a_langgraph_runs_checkpoints_moves_the_head_back(acme, wendy):
    a, b, c = ids(3)
    graph_put(wendy, acme, lg_put("t-1", a, metadata={"run_id": "r1"}, nodes=["n"]))
    graph_put(wendy, acme, lg_put("t-1", b, parent=a, metadata={"run_id": "r2"}))
    graph_put(wendy, acme, lg_put("t-1", c, metadata={"run_id": "r2"}, ns="child"))
    assert envelope_of(acme, "t-1").phase_class == "completed"
    assert langgraph.graph_runs_delete(actor=wendy, tenant=acme, run_ids=["r2", "r9"]) == 2
    assert listed(wendy, acme, thread_id="t-1") == [a]
    env = envelope_of(acme, "t-1")
    assert summary(acme, "t-1")["checkpoint_id"] == a
    assert (env.revision, env.phase_class) == (2, "in_flight")
    assert not Checkpoint.objects.filter(uuid=thread_checkpoint_id("t-1", "child")).exists()
    run = Run.objects.get()
    assert run.latest_checkpoint == env and run.phase_class == "in_flight"
    event = AuditEvent.objects.get(action="langgraph.runs_delete")
    assert event.after["deleted"] == 2 and event.after["run_ids"] == ["r2", "r9"]
    assert langgraph.graph_runs_delete(actor=wendy, tenant=acme, run_ids=[]) == 0


def test_copying_a_thread_copies_checkpoints_writes_and_envelopes(acme, wendy):
    a, b = chain(wendy, acme, "t-1", 2, identity=IDENT, nodes=["n"])
    graph_writes(wendy, acme, lg_writes("t-1", b, "task", [(0, "x", 1)]))
    chain(wendy, acme, "t-1", 1, ns="child")
    assert langgraph.graph_thread_copy(actor=wendy, tenant=acme, source_thread_id="t-1",
                                       target_thread_id="t-2") == 3
    source = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    target = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-2")[0]
    strip = [{k: v for k, v in t.items() if k not in ("thread_id", "run_id")} for t in source]
    assert [{k: v for k, v in t.items() if k not in ("thread_id", "run_id")}
            for t in target] == strip
    assert summary(acme, "t-2") == dict(summary(acme, "t-1"), thread_id="t-2")
    assert envelope_of(acme, "t-2").revision == 0
    run = Run.objects.get(uuid=thread_run_id("t-2"))
    source_run = Run.objects.get(uuid=thread_run_id("t-1"))
    assert (run.workflow, run.phase_label) == ("refund", source_run.phase_label)
    assert envelope_of(acme, "t-2").phase_label == envelope_of(acme, "t-1").phase_label
    event = AuditEvent.objects.get(action="langgraph.thread_copy")
    assert event.run_uuid == run.uuid and event.after["copied"] == 3
    # The copy goes on from the head it copied.
    graph_put(wendy, acme, lg_put("t-2", "2", parent=b))


def test_copying_onto_a_thread_with_checkpoints_is_a_conflict(acme, wendy):
    chain(wendy, acme, "t-1", 1)
    (theirs,) = chain(wendy, acme, "t-2", 1)
    with pytest.raises(ThreadConflict) as refused:
        langgraph.graph_thread_copy(actor=wendy, tenant=acme, source_thread_id="t-1",
                                    target_thread_id="t-2")
    assert refused.value.head_checkpoint_id == theirs
    assert Conflict.objects.get().run.uuid == thread_run_id("t-2")


def test_copying_an_unknown_thread_makes_nothing(acme, wendy):
    before = db_state()
    assert langgraph.graph_thread_copy(actor=wendy, tenant=acme, source_thread_id="ghost",
                                       target_thread_id="t-2") == 0
    assert db_diff(before, db_state()) == {}
    with pytest.raises(InvalidPayload):
        langgraph.graph_thread_copy(actor=wendy, tenant=acme, source_thread_id="a",
                                    target_thread_id="a")


# --------------------------------------------------------------------------------------
# Recovery: a crashed graph is ambiguous like any other run
# --------------------------------------------------------------------------------------

def test_a_graph_that_crashed_mid_step_becomes_ambiguous_after_the_sweep(acme, wendy):
    (a,) = chain(wendy, acme, "t-crash", 1, nodes=["charge"])
    (b,) = chain(wendy, acme, "t-done", 1)  # no next node: completed
    (c,) = chain(wendy, acme, "t-asks", 1, nodes=["approve"])
    graph_writes(wendy, acme, lg_writes("t-asks", c, "t", [(-3, "__interrupt__", "?")]))
    assert Run.objects.get(uuid=thread_run_id("t-crash")).recovery_state == "healthy"
    sweep_later()
    states = dict(Run.objects.values_list("uuid", "recovery_state"))
    assert states[thread_run_id("t-crash")] == "ambiguous"
    assert states[thread_run_id("t-done")] == "completed"
    assert states[thread_run_id("t-asks")] == "healthy"  # waiting for input is stable
    decision = services.resume_preview(actor=wendy, tenant=acme,
                                       run_id=thread_run_id("t-crash"), asked={})
    assert (decision["action"], decision["reason"]) == ("reject", "in_flight")


def test_a_graph_whose_lease_is_live_is_not_ambiguous(acme, wendy):
    chain(wendy, acme, "t-1", 1, nodes=["charge"])
    services.lease_acquire(actor=wendy, tenant=acme, run_id=thread_run_id("t-1"),
                           owner="graph", ttl_s=86400)
    sweep_later()
    assert Run.objects.get().recovery_state == "healthy"


# --------------------------------------------------------------------------------------
# Bad input: named, before any query
# --------------------------------------------------------------------------------------

def _bad(**changes):
    body = lg_put("t-1", "01")
    for key, value in changes.items():
        if key.startswith("checkpoint."):
            body["checkpoint"][key.split(".", 1)[1]] = value
        else:
            body[key] = value
    return body


@pytest.mark.parametrize(("body", "field"), [
    (_bad(thread_id=""), "thread_id"),
    (_bad(thread_id="t" * 257), "thread_id"),
    (_bad(thread_id="a\nb"), "thread_id"),
    (_bad(thread_id=7), "thread_id"),
    (_bad(checkpoint_ns="n" * 257), "checkpoint_ns"),
    (_bad(parent_checkpoint_id=""), "parent_checkpoint_id"),
    (_bad(parent_checkpoint_id="01"), "parent_checkpoint_id"),
    (_bad(extra=1), "extra"),
    (_bad(checkpoint=[]), "checkpoint"),
    (_bad(**{"checkpoint.id": "i" * 129}), "checkpoint.id"),
    (_bad(**{"checkpoint.v": True}), "checkpoint.v"),
    (_bad(**{"checkpoint.channel_values": {"a": "raw"}}), "checkpoint.channel_values.a"),
    (_bad(**{"checkpoint.channel_values": {"a": {"type": "json", "b64": "%%%"}}}),
     "checkpoint.channel_values.a.b64"),
    (_bad(**{"checkpoint.channel_values": {"a": {"type": "t" * 65, "b64": ""}}}),
     "checkpoint.channel_values.a.type"),
    (_bad(**{"checkpoint.channel_versions": {"a": True}}), "checkpoint.channel_versions.a"),
    (_bad(**{"checkpoint.channel_versions": {"a": 2**63}}), "checkpoint.channel_versions.a"),
    (_bad(**{"checkpoint.versions_seen": {"n": []}}), "checkpoint.versions_seen.n"),
    (_bad(**{"checkpoint.updated_channels": "a"}), "checkpoint.updated_channels"),
    (_bad(metadata=[]), "metadata"),
    (_bad(metadata={"run_id": "r" * 129}), "metadata.run_id"),
    (_bad(identity={"team": "x"}), "identity.team"),
    (_bad(identity={"workflow": "w" * 257}), "identity.workflow"),
    (_bad(sends=-1), "sends"),
    (_bad(sends=True), "sends"),
    (_bad(sends=2**31), "sends"),
    (_bad(interrupt_before="charge"), "interrupt_before"),
    (_bad(interrupt_after={"a": 1}), "interrupt_after"),
    (_bad(interrupt_before=["charge", 7]), "interrupt_before[1]"),
    (_bad(interrupt_after=[""]), "interrupt_after[0]"),
])
def test_a_bad_put_is_refused_naming_the_field(body, field):
    with pytest.raises(InvalidPayload) as refused:
        langgraph.parse_put(body)
    assert refused.value.detail.startswith(field + ":"), refused.value.detail


@pytest.mark.parametrize(("change", "field"), [
    ({"task_id": ""}, "task_id"),
    ({"task_path": "p" * 1025}, "task_path"),
    ({"writes": {}}, "writes"),
    ({"writes": [{"idx": 0, "channel": "c", "value": typed(1)}] * 2}, "writes[1].idx"),
    ({"writes": [{"idx": 2**31, "channel": "c", "value": typed(1)}]}, "writes[0].idx"),
    ({"writes": [{"idx": 0, "channel": "", "value": typed(1)}]}, "writes[0].channel"),
    ({"writes": [{"idx": 0, "channel": "c", "value": 1}]}, "writes[0].value"),
    ({"writes": [{"idx": 0, "channel": "c", "value": typed(1), "x": 1}]}, "writes[0].x"),
    ({"writes": [{"idx": 0, "channel": "c", "value": typed(1)}] * 1001}, "writes"),
])
def test_bad_writes_are_refused_naming_the_field(change, field):
    body = dict(lg_writes("t", "01", "task", []), **change)
    with pytest.raises(InvalidPayload) as refused:
        langgraph.parse_writes(body)
    assert refused.value.detail.startswith(field + ":"), refused.value.detail


def test_every_stored_summary_is_a_valid_langgraph_checkpoint_payload(acme, wendy):
    a, b = chain(wendy, acme, "t-1", 2, nodes=["x"], identity=IDENT)
    graph_writes(wendy, acme, lg_writes("t-1", b, "t", [(0, "c", 1)]))
    for rev in CheckpointRevision.objects.all():
        payload = loads_any(crypto.decrypt_text(rev.payload_ciphertext))
        assert kinds.classify("langgraph.checkpoint", 1, payload).supported


def test_the_run_id_is_a_uuid_of_the_thread(acme, wendy):
    answer = graph_put(wendy, acme, lg_put("t-1", "01"))
    assert uuid.UUID(answer["run_id"]) == thread_run_id("t-1") == uuid.uuid5(
        uuid.UUID("6f1c2b0e-4a7d-5c3e-9b8f-1d2e3f405162"), "thread\x1ft-1")


# --------------------------------------------------------------------------------------
# Fencing (CONTRACT.md 3), over every LangGraph write path, as tests/services/
# test_fence_matrix.py does for checkpoints and effects
# --------------------------------------------------------------------------------------

FENCE_IDS = ids(4)  # head's parent, head, a new put, an appended put


def _lg_ousted(how: str, acme, wendy, heir, rita, april) -> int:
    """A thread whose first owner (token 1) was ousted ``how``; returns the current token."""
    run_id = thread_run_id("t-f")
    graph_put(wendy, acme, lg_put("t-f", FENCE_IDS[0], nodes=["charge"]))
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w1", ttl_s=60)
    graph_put(wendy, acme, lg_put("t-f", FENCE_IDS[1], parent=FENCE_IDS[0], nodes=["charge"]),
              token=1)
    if how == "retry-claimed":
        fx = effect_body(run_id=run_id, operation_key="charge:lg")
        put_effect(wendy, acme, fx, token=1)
        put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0, token=1)
        sweep_later()
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=fx["id"], reason="?")
        retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="died")
        services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
        return services.resume_claim(actor=heir, tenant=acme, run_id=run_id,
                                     asked={})["fencing_token"]
    from tests.helpers import age_world

    age_world(120)
    token = services.lease_acquire(actor=heir, tenant=acme, run_id=run_id, owner="w2",
                                   ttl_s=600).fencing_token
    if how == "lease-expired":
        age_world(1200)
    return token


FENCE_PATHS = {
    "put from the head": ("checkpoints", lambda: lg_put("t-f", FENCE_IDS[2],
                                                        parent=FENCE_IDS[1])),
    "put without parent": ("checkpoints", lambda: lg_put("t-f", FENCE_IDS[3])),
    "put of the head again": ("checkpoints", lambda: lg_put("t-f", FENCE_IDS[1],
                                                            parent=FENCE_IDS[0],
                                                            nodes=["charge"])),
    "writes on the head": ("writes", lambda: lg_writes("t-f", FENCE_IDS[1], "t",
                                                       [(0, "x", 1)])),
    "writes on an older checkpoint": ("writes", lambda: lg_writes("t-f", FENCE_IDS[0], "t",
                                                                  [(0, "x", 1)])),
}
FENCE_CASES = [(how, path) for how in ("live-lease", "lease-expired", "retry-claimed")
               for path in FENCE_PATHS]


def _lg_attempt(surface, client, actor, tenant, path, token):
    what, body = FENCE_PATHS[path]
    if surface == "api":
        extra = {"HTTP_FENCING_TOKEN": str(token)} if token is not None else {}
        response = client.post(f"/api/v1/tenants/{tenant.slug}/langgraph/{what}",
                               data=__import__("json").dumps(body()),
                               content_type="application/json", **extra)
        return response.status_code, response.json()
    try:
        if what == "checkpoints":
            graph_put(actor, tenant, body(), token=token)
        else:
            graph_writes(actor, tenant, body(), token=token)
    except Fenced as exc:
        return 409, exc.body()
    return 200, None


@pytest.mark.parametrize(("how", "path"), FENCE_CASES, ids=[f"{h}-{p}" for h, p in FENCE_CASES])
def test_an_ousted_graph_is_fenced_on_every_langgraph_write_path(acme, wendy, rita, april,
                                                                 api_as, how, path):
    from django.db import transaction

    from tests.conftest import _person

    heir = _person("heir", acme, "writer", service=True)
    now = _lg_ousted(how, acme, wendy, heir, rita, april)
    client = api_as(wendy)
    run = Run.objects.get(uuid=thread_run_id("t-f"))
    failures = []
    for surface in ("service", "api"):
        for token in (1, now + 1, None):
            with transaction.atomic():
                before = db_state()
                status, body = _lg_attempt(surface, client, wendy, acme, path, token)
                diff = db_diff(before, db_state())
                conflicts = diff.pop("checkpoints.Conflict", {})
                events = diff.pop("checkpoints.AuditEvent", {})
                for derived in ("checkpoints.AuditPending", "checkpoints.Run",
                                "checkpoints.RunStateCount", "checkpoints.RunTransition",
                                "checkpoints.NotificationOutbox",
                                "checkpoints.ReportCount"):  # triggers' rows
                    diff.pop(derived, None)
                where = f"{surface}, token {token}"
                if (status, body) != (409, {"error": "fenced", "fencing_token": now}):
                    failures.append(f"{where}: {status} {body}")
                elif diff or conflicts.keys() != {"added"} or len(conflicts["added"]) != 1:
                    failures.append(f"{where}: changed {diff}, conflicts {conflicts}")
                else:
                    c = Conflict.objects.get(pk=conflicts["added"][0])
                    got = (c.run_id, c.reason, str(c.target_uuid), c.fencing_token_sent,
                           c.fencing_token_current,
                           [e.action for e in AuditEvent.objects.filter(pk__in=events["added"])])
                    want = (run.pk, "fenced", str(thread_checkpoint_id("t-f", "")), token, now,
                            ["checkpoint.conflict"])
                    if got != want:
                        failures.append(f"{where}: kept {got}, expected {want}")
                transaction.set_rollback(True)
        with transaction.atomic():  # the current token is accepted: the token alone refused
            status, _ = _lg_attempt(surface, client, wendy, acme, path, now)
            if status not in (200, 201):
                failures.append(f"{surface}, current token: {status}")
            transaction.set_rollback(True)
    assert not failures, f"{how} / {path}:\n" + "\n".join(failures)


def test_key_rotation_re_encrypts_langgraph_checkpoints_and_writes(acme, wendy, settings):
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    # Envelope encryption (issue 20): the master key wraps acme's data key (since acme was
    # created, under the development key); rotating re-wraps that key and leaves the
    # ciphertexts as they are. Legacy ones (master-key form) are moved to the data key.
    dev = list(settings.RECOVERY_ENCRYPTION_KEYS)
    settings.RECOVERY_ENCRYPTION_KEYS = [old, *dev]
    (a,) = chain(wendy, acme, "t-1", 1, values={"card": "4242"}, nodes=["n"])
    graph_writes(wendy, acme, lg_writes("t-1", a, "task", [(0, "x", "4242")]))
    stored = GraphWrite.objects.get()
    GraphWrite.objects.filter(pk=stored.pk).update(  # one written before issue 20
        value_ciphertext=crypto.encrypt_text(crypto.decrypt_text(stored.value_ciphertext),
                                             tenant=None))
    settings.RECOVERY_ENCRYPTION_KEYS = [new, old, *dev]
    assert services.payloads_rotate_keys(batch_size=1) == {"rows": 1, "keys": 1, "tenants": 1}
    settings.RECOVERY_ENCRYPTION_KEYS = [new]  # the old key is gone: everything still reads
    (tup,) = langgraph.graph_list(actor=wendy, tenant=acme, thread_id="t-1")[0]
    assert tup["checkpoint"]["channel_values"]["card"] == typed("4242")
    assert tup["pending_writes"][0]["value"] == typed("4242")
