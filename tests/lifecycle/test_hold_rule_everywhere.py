"""One legal-hold rule wherever it is applied (issue 20; DESIGN.md 3a: "a legal hold stops
all of them"; RUNIFOLD.md 5: a tombstone purge needs "no active legal hold"). Three
places used to decide it their own way: the tombstone purge (its own copy of the rule,
over tombstones whose run may be gone), the holds' ``runs_held`` count (its own query of
the subject index) and the erasure preview (a run at a time). Now they read the rule's
home, ``selectors.lifecycle``: ``held_q`` over a run or a tombstone (``held_runs_q``,
``held_tombstones_q``), ``subject_runs_count``, and ``services.runs_blockers``.

A generated table: every set of up to two hold kinds (``KINDS``: runs holds, subject
holds, a tenant hold, released holds, another tenant's hold) over a tenant of objects
(``OBJECTS``: a run still there or gone, indexed under no subject, one or two, its
tombstone absent, with the index copied onto it, or with none). A hand-written oracle
(``RUN_COVERED``, ``STONE_COVERED``) says what each kind covers; the run selectors, the
deletion's blockers, the tombstone purge, the erasure preview and the holds' counts must
all say the same. Rows are written directly (the rule reads rows, whoever wrote them).
SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints import selectors, services
from checkpoints.exceptions import PurgeRefused
from checkpoints.models import (
    ErasureRequest,
    HeldRun,
    LegalHold,
    Run,
    RunSubject,
    Tombstone,
)
from checkpoints.selectors.lifecycle import holds_runs_now
from checkpoints.services.tombstones import _free
from checkpoints.vocab import HoldScope

pytestmark = pytest.mark.django_db

#: A run and its tombstone by what they carry: ``run`` (the run row is still there: its
#: payloads deleted when it has a tombstone), ``index`` (its ``RunSubject`` pairs),
#: ``stone`` (no tombstone: ``None``; else the pairs retention copied onto it).
CA, CB, AA = ("customer", "d-cust-a"), ("customer", "d-cust-b"), ("account", "d-acct-a")
OBJECTS = {
    "live a": {"run": True, "index": [CA], "stone": None},
    "live none": {"run": True, "index": [], "stone": None},
    "purged b": {"run": True, "index": [CB], "stone": [CB]},
    "erased": {"run": True, "index": [], "stone": []},
    "old stone, run indexed acct": {"run": True, "index": [AA], "stone": []},
    "gone a": {"run": False, "index": [], "stone": [CA]},
    "gone acct+b": {"run": False, "index": [], "stone": [AA, CB]},
    "gone erased": {"run": False, "index": [], "stone": []},
    # Not a list of pairs (a row written by hand): holds no subject, and breaks nothing.
    "gone flat": {"run": False, "index": [], "stone": [], "raw": list(CA)},
}
ALL = set(OBJECTS)
#: Hold kind -> (tenant "acme"/"globex", scope, what it names: object keys or a pair,
#: released?).
KINDS = {
    "names live a": ("acme", HoldScope.RUNS, ["live a"], False),
    "names gone a + erased": ("acme", HoldScope.RUNS, ["gone a", "erased"], False),
    "names gone erased": ("acme", HoldScope.RUNS, ["gone erased"], False),
    "customer a": ("acme", HoldScope.SUBJECT, CA, False),
    "customer b": ("acme", HoldScope.SUBJECT, CB, False),
    "account a": ("acme", HoldScope.SUBJECT, AA, False),
    "customer nobody": ("acme", HoldScope.SUBJECT, ("customer", "d-nobody"), False),
    "reversed pair": ("acme", HoldScope.SUBJECT, ("d-cust-a", "customer"), False),
    "field of another": ("acme", HoldScope.SUBJECT, ("account", "d-cust-b"), False),
    "tenant": ("acme", HoldScope.TENANT, None, False),
    "released names live a": ("acme", HoldScope.RUNS, ["live a"], True),
    "released customer a": ("acme", HoldScope.SUBJECT, CA, True),
    "released tenant": ("acme", HoldScope.TENANT, None, True),
    "globex names live a": ("globex", HoldScope.RUNS, ["live a"], False),
    "globex customer a": ("globex", HoldScope.SUBJECT, CA, False),
    "globex tenant": ("globex", HoldScope.TENANT, None, False),
}
#: The oracle, by hand: which objects' runs (still there) each kind covers ...
RUN_COVERED = {
    "names live a": {"live a"}, "names gone a + erased": {"erased"},
    "names gone erased": set(), "customer a": {"live a"}, "customer b": {"purged b"},
    "account a": {"old stone, run indexed acct"}, "customer nobody": set(),
    "reversed pair": set(), "field of another": set(),
    "tenant": {k for k, o in OBJECTS.items() if o["run"]},
    "released names live a": set(), "released customer a": set(), "released tenant": set(),
    "globex names live a": set(), "globex customer a": set(), "globex tenant": set(),
}
#: ... and which objects' tombstones (the run there or gone).
STONE_COVERED = {
    "names live a": set(), "names gone a + erased": {"gone a", "erased"},
    "names gone erased": {"gone erased"}, "customer a": {"gone a"},
    "customer b": {"purged b", "gone acct+b"},
    "account a": {"old stone, run indexed acct", "gone acct+b"}, "customer nobody": set(),
    "reversed pair": set(), "field of another": set(),
    "tenant": {k for k, o in OBJECTS.items() if o["stone"] is not None},
    "released names live a": set(), "released customer a": set(), "released tenant": set(),
    "globex names live a": set(), "globex customer a": set(), "globex tenant": set(),
}
TABLE = [c for n in range(0, 3) for c in itertools.combinations(KINDS, n)]


def _object(tenant, key: str) -> tuple[uuid.UUID, Run | None, Tombstone | None]:
    spec = OBJECTS[key]
    run_uuid, run, stone = uuid.uuid4(), None, None
    if spec["run"]:
        run = Run.objects.create(tenant=tenant, uuid=run_uuid, kind="acme.order",
                                 recovery_state="completed")
        RunSubject.objects.bulk_create([RunSubject(tenant=tenant, run=run, field=f, digest=d)
                                        for f, d in spec["index"]])
    if spec["stone"] is not None:
        stone = Tombstone.objects.create(
            tenant=tenant, run_uuid=run_uuid, kind="acme.order", final_state="completed",
            cause="retention", run_created_at=timezone.now(), deleted_at=timezone.now(),
            subjects=spec.get("raw", [list(p) for p in spec["stone"]]))
        if run is not None:
            Run.objects.filter(pk=run.pk).update(payloads_deleted_at=timezone.now())
            run.refresh_from_db()
    return run_uuid, run, stone


def _hold(tenants, by, kind: str, ids: dict) -> LegalHold:
    slug, scope, names, released = KINDS[kind]
    tenant = tenants[slug]
    field, digest = names if scope == HoldScope.SUBJECT else ("", "")
    runs = [str(ids[k]) for k in names] if scope == HoldScope.RUNS else []
    hold = LegalHold.objects.create(
        tenant=tenant, uuid=uuid.uuid4(), scope=scope, run_uuids=runs, subject_field=field,
        subject_digest=digest, reason=f"case {kind}", placed_by=by,
        placed_by_name=by.get_username(), released_at=timezone.now() if released else None)
    HeldRun.objects.bulk_create([HeldRun(tenant=tenant, hold=hold, run_uuid=r) for r in runs])
    return hold


@pytest.fixture
def world(acme, globex, adam):
    """The objects in acme, and the same in globex (same subject digests: another
    tenant's index must never count)."""
    objects = {key: _object(acme, key) for key in OBJECTS}
    twins = {key: _object(globex, key) for key in OBJECTS}
    return objects, twins


@pytest.mark.parametrize("kinds", TABLE, ids=lambda c: "+".join(c) or "none")
def test_the_selectors_the_blockers_the_purge_and_the_preview_agree_with_the_one_rule(
        acme, globex, adam, vic, world, kinds):
    objects, twins = world
    ids = {key: run_uuid for key, (run_uuid, _, _) in objects.items()}
    holds = {kind: _hold({"acme": acme, "globex": globex}, adam, kind, ids) for kind in kinds}
    runs_held = set().union(*(RUN_COVERED[k] for k in kinds))
    stones_held = set().union(*(STONE_COVERED[k] for k in kinds))
    whole = "tenant" in kinds
    present = {key: run for key, (_, run, _) in objects.items() if run is not None}

    # The run selectors: from the holds (retention's candidates) and from one run.
    q = selectors.held_runs_q(acme)
    assert (q is None) is whole
    found = {key for key, run in present.items()
             if q is None or Run.objects.for_tenant(acme).filter(q, pk=run.pk).exists()}
    assert found == runs_held, kinds
    for key, run in present.items():
        covering = {h.reason for h in selectors.covering_holds(run)}
        assert covering == {f"case {k}" for k in kinds if key in RUN_COVERED[k]}, (key, kinds)

    # The deletion's blockers, one run and all at once (what erasure and retention judge).
    judged = services.runs_blockers(acme, list(present.values()), deleted_ok=True)
    for key, run in present.items():
        assert (services.Blocker.HELD in judged[run.pk]) is (key in runs_held), (key, kinds)
        assert services.run_blockers(run, deleted_ok=True) == judged[run.pk], (key, kinds)

    # The tombstone purge: what it may freeze, and the Q it reads.
    stones = Tombstone.objects.for_tenant(acme)
    by_id = {stone.pk: key for key, (_, _, stone) in objects.items() if stone is not None}
    if whole:
        with pytest.raises(PurgeRefused):
            _free(acme, stones, 1000)
        assert selectors.held_tombstones_q(acme) is None
    else:
        free = {by_id[i] for i, _ in _free(acme, stones, 1000)}
        assert free == set(by_id.values()) - stones_held, kinds
        assert {by_id[i] for i in stones.filter(selectors.held_tombstones_q(acme))
                .values_list("id", flat=True)} == stones_held, kinds

    # The erasure preview of every object's run id.
    request = ErasureRequest.objects.create(
        tenant=acme, uuid=uuid.uuid4(), run_uuids=[str(i) for i in ids.values()],
        reason="art. 17", requested_by=adam, requested_by_name="adam")
    preview = services.erasure_preview(user=vic, tenant=acme, request=request)
    live = {key for key, run in present.items() if run.payloads_deleted_at is None}
    assert preview["legal_hold"] == len(live & runs_held), kinds
    assert preview["erased"] == len(live - runs_held), kinds
    assert preview["already_deleted"] == len(OBJECTS) - len(live), kinds

    # The holds' counts: a subject hold's runs_held is the length of its runs_now, uncut.
    listed = selectors.legal_hold_list(user=vic, tenant=acme)
    now = holds_runs_now(acme, listed, 1000)
    for hold in listed:
        kind = hold.reason.removeprefix("case ")
        if hold.scope == HoldScope.SUBJECT:
            assert hold.runs_held == len(now[hold.pk]) == len(RUN_COVERED[kind]), kinds

    # Another tenant: its twin objects answer to its own holds only.
    theirs = selectors.held_runs_q(globex)
    twin_runs = [run for _, run, _ in twins.values() if run is not None]
    held_twins = {run.pk for run in twin_runs
                  if theirs is None or Run.objects.filter(theirs, pk=run.pk).exists()}
    expected = {twins["live a"][1].pk} if "globex customer a" in kinds else set()
    assert held_twins == ({r.pk for r in twin_runs} if "globex tenant" in kinds
                          else expected), kinds
    assert holds.keys() == set(kinds)


def _preview_queries(acme, adam, vic, n: int) -> int:
    runs = [Run.objects.create(tenant=acme, uuid=uuid.uuid4(), kind="acme.order",
                               recovery_state="completed") for _ in range(n)]
    request = ErasureRequest.objects.create(
        tenant=acme, uuid=uuid.uuid4(), run_uuids=[str(r.uuid) for r in runs],
        reason="art. 17", requested_by=adam, requested_by_name="adam")
    with CaptureQueriesContext(connection) as queries:
        preview = services.erasure_preview(user=vic, tenant=acme, request=request)
    assert preview["erased"] == n
    return len(queries)


def test_the_preview_costs_the_same_queries_for_any_number_of_runs(acme, adam, vic):
    """The erasure preview judges every covered run at once (``runs_blockers``): its query
    count does not grow with the runs (it was 1 + 2 per covered run)."""
    _preview_queries(acme, adam, vic, 1)  # the rights read once
    one, many = _preview_queries(acme, adam, vic, 1), _preview_queries(acme, adam, vic, 25)
    assert one == many <= 6, (one, many)
