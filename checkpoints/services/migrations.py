"""Checkpoint migrations (issue 19, item 2; docs/migrations.md): the operator moves a
kind's checkpoints to another schema version through the kind's chain of registered
upcasters (``kinds.migrate``).

``checkpoints_migrate`` walks the tenant's checkpoints of the kind that are not at the
target version (``batch_size`` ids at a time, in primary-key order) and migrates each in
its **own** transaction, so a process killed mid-batch leaves the finished ones committed
and a second run goes on from there:

1. lock the run (``locks``: the tenant's audit head, then the run) and read the
   checkpoint under that lock; already at the target version: ``skipped`` (so a second
   or resumed run never migrates one twice);
2. a chain of migrations must lead there, in the direction asked (``reverse`` for
   down): else ``refused`` ``no_path`` / ``not_reversible``;
3. the run's owner must be gone, by reconciliation's rule (``require_owner_gone``):
   else ``refused`` ``owner_live``;
4. migrate (``kinds.migrate``: each step's result matches its version; no usage counter
   goes down): else ``refused`` (``invalid_after``, or the step's own refusal);
5. write the result as ONE new revision through the checkpoint write path
   (``writepath.checkpoint_write``, expected = the revision read): its compare-and-swap,
   history row, the run's recovery state, the run's fencing token one up (a late write
   of the owner that went quiet is fenced, and kept as a conflict), and one
   ``checkpoint.migrate`` audit event naming the migration, both versions and the batch.
   A write that got there first wins: ``conflict`` (the refused migration is kept as a
   conflict, like any refused write), never overwritten.

``dry_run``: the same walk and checks without a lock, a write or an audit event (a
preview, like ``GET …/resume``). Either way the report has each checkpoint's outcome, the
counts, and one example per distinct change (``upcasters.payload_diff``: key paths, no
payload values).
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field

from django.db import transaction

from .. import crypto, kinds, policy, roles, upcasters
from ..dbclock import NOW
from ..exceptions import InvalidPayload, OwnerLive, StaleRevision, UsageDecreased
from ..jsonparse import dumps, loads_any
from ..models import Checkpoint, Run, Tenant
from ..permissions import require
from ..vocab import MigrationOutcome, MigrationRefusal
from . import writepath
from .checkpoints import Envelope, _stored_form
from .runs import _lock_run, require_owner_gone

MAX_BATCH = 10_000


@dataclass
class MigrationItem:
    """One checkpoint's result: ``outcome`` a ``MigrationOutcome``; ``reason`` the
    ``MigrationRefusal`` of a refused one; ``revision`` the revision read (the one a
    migration replaced); ``detail`` words for people (versions and fields, never a
    payload value)."""

    checkpoint_id: uuid.UUID
    run_id: uuid.UUID
    outcome: str
    from_version: int | None = None
    revision: int | None = None
    reason: str = ""
    detail: str = ""


@dataclass
class MigrationReport:
    """What ``checkpoints_migrate`` did (or, ``dry_run``, would do) in one tenant."""

    batch_id: uuid.UUID
    kind: str
    to_version: int
    reverse: bool
    dry_run: bool
    items: list[MigrationItem] = field(default_factory=list)
    # (from_version, added, removed, changed) -> the example of that change
    changes: dict[tuple, dict] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(item.outcome for item in self.items)
        return {outcome: found[outcome] for outcome in MigrationOutcome.values}

    @property
    def refusals(self) -> dict[str, int]:
        return dict(Counter(i.reason for i in self.items if i.outcome == MigrationOutcome.REFUSED))

    @property
    def examples(self) -> list[dict]:
        """One per distinct change: ``{from_version, to_version, added, removed, changed,
        count, checkpoint_id}`` (key paths only), most frequent first."""
        return sorted(self.changes.values(), key=lambda e: (-e["count"], e["from_version"]))

    def _change(self, item: MigrationItem, diff: dict[str, list[str]]) -> None:
        key = (item.from_version, *(tuple(diff[k]) for k in ("added", "removed", "changed")))
        example = self.changes.setdefault(key, {
            "from_version": item.from_version, "to_version": self.to_version, **diff,
            "count": 0, "checkpoint_id": str(item.checkpoint_id)})
        example["count"] += 1


@dataclass(frozen=True)
class _Target:
    actor: object
    tenant: Tenant
    kind: str
    to_version: int
    reverse: bool
    batch_id: uuid.UUID


def checkpoints_migrate(*, actor, tenant: Tenant, kind: str, to_version: int,
                        run_ids=None, dry_run: bool = False, reverse: bool = False,
                        batch_size: int = 100) -> MigrationReport:
    """Migrate ``tenant``'s checkpoints of ``kind`` to ``to_version`` (only those of the
    runs ``run_ids`` when given), each in its own transaction (module docstring);
    ``reverse`` takes the steps back (``down``), and only those; ``dry_run`` writes,
    locks and audits nothing. Returns the ``MigrationReport``.

    ``actor``: ``None`` for the operator's command, else an account that needs the
    tenant admin's right (``roles.MANAGE``). Raises, before anything is done,
    ``NotFound``/``Forbidden`` (rights), ``InvalidPayload`` naming the field (``kind``
    not registered, ``to_version`` not one of its versions, ``run_ids`` not run ids,
    ``batch_size`` outside 1..10000). A checkpoint's refusal is its item, never raised;
    an unexpected error (a bug in a step) stops the walk and propagates, the checkpoints
    done before it staying committed.
    """
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    versions = kinds.registered().get(kind) if isinstance(kind, str) else None
    if not versions:
        raise InvalidPayload(f"kind: {str(kind)[:200]!r} is not a registered kind")
    if type(to_version) is not int or to_version not in versions:
        raise InvalidPayload(f"to_version: {kind} has versions "
                             f"{', '.join(str(v) for v in versions)}")
    if type(batch_size) is not int or not 1 <= batch_size <= MAX_BATCH:
        raise InvalidPayload(f"batch_size: must be an integer in 1..{MAX_BATCH}")
    runs = None if run_ids is None else _run_ids(run_ids)
    target = _Target(actor, tenant, kind, to_version, bool(reverse), uuid.uuid4())
    report = MigrationReport(target.batch_id, kind, to_version, bool(reverse), bool(dry_run))
    for rows in _candidates(target, runs, batch_size):
        for pk, checkpoint_id, run_id in rows:
            if dry_run:
                item, diff = _preview_one(target, pk, checkpoint_id, run_id)
            else:
                item, diff = _migrate_one(target, pk, checkpoint_id, run_id)
            report.items.append(item)
            if diff is not None:
                report._change(item, diff)
    return report


def _run_ids(values) -> list[uuid.UUID]:
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise InvalidPayload("run_ids: must be a list of run ids")
    out = []
    for value in values:
        try:
            out.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise InvalidPayload(f"run_ids: {str(value)[:64]!r} is not a run id (a UUID)") \
                from None
    return out


def _candidates(target: _Target, runs: list[uuid.UUID] | None, batch_size: int):
    """``[(pk, checkpoint uuid, run uuid)]`` batches of the checkpoints to look at, in
    primary-key order (each once per call, however the walk changes them)."""
    rows = (Checkpoint.objects.for_tenant(target.tenant).filter(kind=target.kind)
            .exclude(schema_version=target.to_version))
    if runs is not None:
        rows = rows.filter(run__uuid__in=runs)
    last = 0
    while True:
        batch = list(rows.filter(pk__gt=last).order_by("pk")
                     .values_list("pk", "uuid", "run__uuid")[:batch_size])
        if not batch:
            return
        yield batch
        if len(batch) < batch_size:  # the last one: no query for an empty batch
            return
        last = batch[-1][0]


def _read(tenant: Tenant, pk: int) -> dict | None:
    return (Checkpoint.objects.for_tenant(tenant).filter(pk=pk)
            .values("uuid", "revision", "schema_version", "payload_ciphertext",
                    "updated_at_ms", "usage").first())


def _refused(item: MigrationItem, reason: str, detail: str) -> MigrationItem:
    item.outcome, item.reason, item.detail = MigrationOutcome.REFUSED, reason, detail
    return item


def _owner_facts(run: Run) -> policy.RunFacts:
    """The facts ``require_owner_gone`` reads for ``run`` (its lease, its last write, the
    tenant's ambiguity threshold, the database time read with the run), without the
    effect and retry queries of ``run_facts``: whether the owner is gone
    (``policy.RunFacts.owner_gone``, CONTRACT.md 1) depends on nothing else, and this
    runs once per checkpoint of a migration (the write path reads the full facts for the
    run's recovery state)."""
    return policy.RunFacts.of(run, now=run.db_now,
                              ambiguity_threshold_s=run.tenant.ambiguity_threshold_s)


def _assess(target: _Target, run: Run, row: dict):
    """Steps 1-4 of the module docstring for one checkpoint read with its run: its
    ``MigrationItem`` (outcome ``migrated`` when it can be) and, when it can, ``(the
    stored payload, the migrated one, its classification, the chain)``, else ``None``."""
    item = MigrationItem(row["uuid"], run.uuid, MigrationOutcome.MIGRATED,
                         row["schema_version"], row["revision"])
    source = row["schema_version"]
    if source == target.to_version:
        item.outcome, item.detail = MigrationOutcome.SKIPPED, f"already at v{source}"
        return item, None
    try:
        if (source > target.to_version) != target.reverse:
            kinds.migration_path(target.kind, source, source)  # an unknown version says so
            way = "down needs reverse" if not target.reverse else "reverse only goes down"
            raise upcasters.NoMigrationPath(f"{target.kind} v{source} to "
                                            f"v{target.to_version}: {way}")
        kinds.migration_path(target.kind, source, target.to_version)
        require_owner_gone(run, _owner_facts(run), "migrate its checkpoint")
        payload = loads_any(crypto.decrypt_text(row["payload_ciphertext"]))
        new, cls, path = kinds.migrate(target.kind, source, target.to_version, payload)
    except upcasters.MigrationError as exc:
        return _refused(item, exc.reason, str(exc)), None
    except OwnerLive as exc:
        return _refused(item, MigrationRefusal.OWNER_LIVE, exc.detail.removeprefix("run: ")), None
    decrease = policy.usage_decrease(row["usage"] or {}, cls.usage)
    if decrease is not None:
        return _refused(item, MigrationRefusal.INVALID_AFTER,
                        f"usage counter {decrease[0]} would go down"), None
    return item, (payload, new, cls, path)


def _preview_one(target: _Target, pk: int, checkpoint_id, run_id):
    """A dry run's look at one checkpoint: no lock, no write, no audit event."""
    run = Run.objects.for_tenant(target.tenant).annotate(db_now=NOW).filter(uuid=run_id).first()
    row = _read(target.tenant, pk) if run is not None else None
    if row is None:
        return MigrationItem(checkpoint_id, run_id, MigrationOutcome.SKIPPED,
                             detail="deleted meanwhile"), None
    run.tenant = target.tenant
    item, migrated = _assess(target, run, row)
    if migrated is None:
        return item, None
    payload, new, _, _ = migrated
    return item, upcasters.payload_diff(payload, new)


def _migrate_one(target: _Target, pk: int, checkpoint_id, run_id):
    """One checkpoint, in its own transaction (module docstring, steps 1-5)."""
    with transaction.atomic():
        run = _lock_run(target.tenant, run_id, create=False)
        row = _read(target.tenant, pk) if run is not None else None
        if row is None:
            return MigrationItem(checkpoint_id, run_id, MigrationOutcome.SKIPPED,
                                 detail="deleted meanwhile"), None
        item, migrated = _assess(target, run, row)
        if migrated is None:
            return item, None
        payload, new, _, path = migrated
        envelope = Envelope(row["uuid"], run.uuid, row["revision"] + 1, target.kind,
                            target.to_version, new, dumps(new), row["updated_at_ms"])
        written = writepath.checkpoint_write(
            actor=target.actor, tenant=target.tenant, envelope=envelope,
            expected_revision=row["revision"], fencing_token=run.fencing_token,
            migration=writepath.Migrating(tuple(path.names), row["schema_version"],
                                          target.batch_id),
            **_stored_form(envelope))
    if isinstance(written, StaleRevision | UsageDecreased):
        item.outcome = MigrationOutcome.CONFLICT
        item.detail = (f"a write reached revision {written.current_revision} first; it stands"
                       if isinstance(written, StaleRevision) else str(written))
        return item, None
    return item, upcasters.payload_diff(payload, new)
