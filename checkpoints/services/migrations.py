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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from django.db import transaction

from .. import crypto, declared, kinds, policy, roles, upcasters
from ..dbclock import NOW
from ..exceptions import InvalidPayload, OwnerLive, StaleRevision, UsageDecreased
from ..jsonparse import dumps, loads_any
from ..models import Checkpoint, Run, Tenant
from ..permissions import require
from ..vocab import MigrationOutcome, MigrationRefusal
from . import writepath
from .checkpoints import Envelope, _stored_form
from .common import _run_ids_check
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
    #: whether ``items`` keeps every item (false when the caller records them itself)
    keep_items: bool = True
    _outcomes: Counter = field(default_factory=Counter)
    _reasons: Counter = field(default_factory=Counter)

    @property
    def counts(self) -> dict[str, int]:
        return {outcome: self._outcomes[outcome] for outcome in MigrationOutcome.values}

    @property
    def refusals(self) -> dict[str, int]:
        return dict(self._reasons)

    def _add(self, item: MigrationItem) -> None:
        self._outcomes[item.outcome] += 1
        if item.outcome == MigrationOutcome.REFUSED:
            self._reasons[item.reason] += 1
        if self.keep_items:
            self.items.append(item)

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
    lookup: kinds.Lookup  # the tenant's declared kinds


def migration_target_check(tenant: Tenant, kind, to_version, *,
                           lookup: kinds.Lookup | None = None) -> list[int]:
    """The one check of a migration's kind and target version (the command, the API, the
    dashboard and the stored jobs all come here): ``kind`` must be a kind in code or one
    ``tenant`` declared (``lookup``: ``declared.lookup(tenant)``, made here when not
    given), and ``to_version`` one of its versions. Returns the kind's versions, oldest
    first. Raises ``InvalidPayload`` naming ``kind`` or ``to_version``."""
    versions = kinds.versions(kind, lookup=lookup or declared.lookup(tenant))
    if not versions:
        raise InvalidPayload(f"kind: {str(kind)[:200]!r} is not a registered kind")
    if type(to_version) is not int or to_version not in versions:
        raise InvalidPayload(f"to_version: {kind} has versions "
                             f"{', '.join(str(v) for v in versions)}")
    return list(versions)


def checkpoints_migrate(*, actor, tenant: Tenant, kind: str, to_version: int,
                        run_ids=None, dry_run: bool = False, reverse: bool = False,
                        batch_size: int = 100, batch_id: uuid.UUID | None = None,
                        on_item: Callable[[MigrationItem], None] | None = None,
                        before_batch: Callable[[], object] | None = None,
                        ) -> MigrationReport:
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

    ``batch_id``: the id written into each ``checkpoint.migrate`` event (a stored job's
    own id, the same on every attempt); a new one when not given. ``on_item``: called
    with each checkpoint's ``MigrationItem`` (not a dry run: inside that checkpoint's
    transaction, so what it writes commits or rolls back with the migration; an
    exception from it rolls that checkpoint back and stops the walk); the report then
    keeps the counts and examples but not the items (a job of 10,000 checkpoints records
    them as it goes instead of holding them). ``before_batch``: called before each batch
    of ``batch_size`` checkpoints, returns the account that batch is written as (a stored
    job's requester read again, ``jobs.migrations._requester``); an exception from it
    stops the walk before the batch, the batches before it staying committed.
    """
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    lookup = declared.lookup(tenant)
    migration_target_check(tenant, kind, to_version, lookup=lookup)
    if type(batch_size) is not int or not 1 <= batch_size <= MAX_BATCH:
        raise InvalidPayload(f"batch_size: must be an integer in 1..{MAX_BATCH}")
    runs = None if run_ids is None else _run_ids(run_ids)
    target = _Target(actor, tenant, kind, to_version, bool(reverse), batch_id or uuid.uuid4(),
                     lookup)
    report = MigrationReport(target.batch_id, kind, to_version, bool(reverse), bool(dry_run),
                             keep_items=on_item is None)
    for rows in _candidates(target, runs, batch_size):
        if before_batch is not None:
            # A stored job outlives the request that checked its requester: each batch
            # is written as the account read now (a revoked admin stops the job here).
            target = replace(target, actor=before_batch())
        for pk, checkpoint_id, run_id in rows:
            if dry_run:
                item, diff = _preview_one(target, pk, checkpoint_id, run_id)
                if on_item is not None:
                    on_item(item)
            else:
                item, diff = _migrate_one(target, pk, checkpoint_id, run_id, on_item)
            report._add(item)
            if diff is not None:
                report._change(item, diff)
    return report


def _run_ids(values) -> list[uuid.UUID]:
    return _run_ids_check(values, field="run_ids", most=None, what="", empty=None)


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
            # an unknown version says so:
            kinds.migration_path(target.kind, source, source, lookup=target.lookup)
            way = "down needs reverse" if not target.reverse else "reverse only goes down"
            raise upcasters.NoMigrationPath(f"{target.kind} v{source} to "
                                            f"v{target.to_version}: {way}")
        kinds.migration_path(target.kind, source, target.to_version, lookup=target.lookup)
        require_owner_gone(run, _owner_facts(run), "migrate its checkpoint")
        payload = loads_any(crypto.decrypt_text(row["payload_ciphertext"], tenant=run.tenant_id))
        new, cls, path = kinds.migrate(target.kind, source, target.to_version, payload,
                                       lookup=target.lookup)
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


def _migrate_one(target: _Target, pk: int, checkpoint_id, run_id, on_item=None):
    """One checkpoint, in its own transaction (module docstring, steps 1-5); ``on_item``
    records its item in that same transaction."""
    with transaction.atomic():
        item, diff = _migrate_locked(target, pk, checkpoint_id, run_id)
        if on_item is not None:
            on_item(item)
    return item, diff


def _migrate_locked(target: _Target, pk: int, checkpoint_id, run_id):
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
        **_stored_form(envelope, target.tenant, refuse=False))
    if isinstance(written, StaleRevision | UsageDecreased):
        item.outcome = MigrationOutcome.CONFLICT
        item.detail = (f"a write reached revision {written.current_revision} first; it stands"
                       if isinstance(written, StaleRevision) else str(written))
        return item, None
    return item, upcasters.payload_diff(payload, new)
