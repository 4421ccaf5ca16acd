"""The audit export and the four-eyes purge of tombstones (issue 20, item 5; RUNIFOLD.md
5, "Tombstone governance"; DESIGN.md 3a; docs/security/audit.md).

Tombstones are kept forever unless the tenant's policy sets ``tombstone_retention_days``.
Then a purge may delete tombstones that are older than that retention, were exported
first (``audit_export``: their id is at most the export watermark), and are under no
active legal hold, in four steps, each audited:

1. ``tombstone_purge_prepare`` (admin) freezes at most ``TOMBSTONE_PURGE_MAX`` of them
   (ids, fingerprint, cursors, the watermark) with an approval deadline;
2. ``tombstone_purge_approve`` or ``tombstone_purge_reject`` (approver; never the
   preparer, a database check too), before the deadline;
3. ``tombstone_purge_execute`` (admin), before the deadline, under the tenant's audit
   head (the lock every write of the tenant, a legal hold's too, takes first): re-checks
   the holds, the fingerprint of the frozen tombstones still there and the deadline, then
   deletes exactly them and writes the evidence on the purge row.

Every time compared is the database's (``dbclock``).
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Max

from .. import auditexport, audittree, locks, roles
from ..audit import audit_record
from ..dbclock import db_now
from ..exceptions import Forbidden, InvalidPayload, NotFound, NotIntegrated, PurgeRefused
from ..models import (
    TOMBSTONE_PURGE_MAX,
    AuditExport,
    AuditTreeHead,
    Tenant,
    Tombstone,
    TombstonePurge,
)
from ..permissions import require
from ..vocab import AuditAction, PurgeState, TargetType
from .holds import _lifecycle_reason
from .lifecycle import held_tombstones_q, policy_for

#: How long a prepared purge waits for its approval and execution (RUNIFOLD.md 5).
PURGE_DEADLINE = timedelta(hours=24)


# --------------------------------------------------------------------------------------
# The export
# --------------------------------------------------------------------------------------

def export_watermark(tenant: Tenant | int) -> tuple[int, int]:
    """``(through_seq, through_tombstone)`` of the tenant's exports so far: the highest of
    each over every ``AuditExport`` (``(0, 0)``: none). Highest, not newest, so the
    watermark only moves forward whatever order exports come in. One query.

    Since migration 0040 an export covers a prefix of the tenant's Merkle tree
    (``through_tree_size``): a larger prefix holds every event of a smaller one, so the
    highest ``through_seq`` is still the largest export's. ``through_tombstone`` is the
    newest tombstone the exported deletions name: a tombstone is written with its
    deletion event, one run at a time under the run's lock and the retention lease or the
    tenant's gate (``services.lifecycle.purge_run_payloads``), so every tombstone with a
    lower id was committed, and its event integrated, before it."""
    row = AuditExport.objects.for_tenant(tenant).aggregate(
        seq=Max("through_seq"), tombstone=Max("through_tombstone"))
    return row["seq"] or 0, row["tombstone"] or 0


def _export_head(tenant: Tenant, through_tree_size: int | None) -> AuditTreeHead:
    """Integrate the tenant's queue (``audittree.audit_integrate``, as the verifier does),
    then the signed head to export: the newest, or the one of ``through_tree_size``
    leaves. Raises ``InvalidPayload`` naming ``through_tree_size``, ``NotIntegrated``
    when the tenant has no signed head yet (another sequencer holds its lease)."""
    if through_tree_size is not None and (type(through_tree_size) is not int
                                          or through_tree_size < 1):
        raise InvalidPayload("through_tree_size: must be an integer >= 1 (the size of a "
                             "signed tree head)")
    while audittree.audit_integrate(tenant):
        pass
    newest = audittree.newest_head(tenant.pk)
    if newest is None:
        raise NotIntegrated("the tenant has no signed audit tree head yet (the sequencer "
                            "is integrating its events): retry")
    if through_tree_size is None or through_tree_size == newest.tree_size:
        return newest
    head = (AuditTreeHead.objects.for_tenant(tenant).filter(tree_size=through_tree_size)
            .first() if through_tree_size < newest.tree_size else None)
    if head is None:
        sizes = list(AuditTreeHead.objects.for_tenant(tenant).order_by("-tree_size")
                     .values_list("tree_size", flat=True)[:5])
        raise InvalidPayload(
            f"through_tree_size: {through_tree_size} is not the size of a signed tree head "
            f"(1..{newest.tree_size}; a head is signed per sequencer batch; the newest: "
            f"{', '.join(map(str, sizes))})")
    return head


def audit_export(*, actor, tenant: Tenant, out_dir: str | Path,
                 through_tree_size: int | None = None) -> dict:
    """Export the prefix of the tenant's sealed audit tree (docs/security/audit.md, "The
    audit export"): integrate its queue, then write the events of leaves 0..S-1 in leaf
    order, S the newest signed tree head's size or ``through_tree_size`` (a stored head's),
    and the tombstones up to the newest one those events' deletions name, into
    ``out_dir`` (created if missing; must not hold an export already): ``audit.jsonl``,
    ``tombstones.jsonl`` and a signed ``manifest.json`` holding the signed head
    (``checkpoints.auditexport``). Then, in one transaction under the tenant's audit head,
    records an ``AuditExport`` row (``through_tree_size`` S, ``through_seq`` the highest
    seq exported) and an ``audit.export`` event (both naming the manifest's SHA-256).

    A signed head fixes its leaves for ever and leaves are appended only from committed
    events, so the export holds every event it claims; an event committed later (even
    with a lower seq: seq is given at INSERT) is a later leaf, in the next export.
    Every export is recorded; one not past the watermark (tree size and tombstone) writes
    its files and its row but does not move it, which the result says
    (``watermark_moved``). The export's own event comes after the head: the next export
    covers it.

    ``actor``: a tenant admin, or ``None`` for the operator's command line
    (``manage.py export_audit``). Returns the manifest plus ``export`` (the row's id),
    ``watermark_moved`` and ``dir``. Raises ``NotFound``/``Forbidden``,
    ``InvalidPayload`` (``through_tree_size`` not a signed head's size; ``out``: not a
    directory, or one holding an export), ``NotIntegrated`` (no signed head yet),
    ``exceptions.TreeIncomplete`` (the stored tree does not hash to its head), ``OSError``
    from the files (nothing recorded).
    """
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidPayload(f"out: {out} is not a directory")
    if any((out / name).exists() for name in (*auditexport.FILES, auditexport.MANIFEST_FILE)):
        raise InvalidPayload(f"out: {out} already holds an export (use a new directory)")
    head = _export_head(tenant, through_tree_size)
    out.mkdir(parents=True, exist_ok=True)
    written = auditexport.write_files(tenant, out, head)
    manifest = auditexport.sign_manifest({
        "format": auditexport.FORMAT, "tenant": tenant.slug, "tenant_id": tenant.pk,
        "through_seq": written["through_seq"], "last_hash": written["last_hash"],
        "through_tombstone": written["through_tombstone"],
        "legacy_seq": auditexport.legacy_seq_of(tenant), "counts": written["counts"],
        "sha256": written["sha256"], "exported_at": db_now().isoformat(),
        "through_tree_size": head.tree_size,
        "tree_head": {"tenant": tenant.slug, **audittree.head_json(head)}})
    text = auditexport.dumps(manifest) + "\n"
    manifest_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    with open(out / auditexport.MANIFEST_FILE, "x", encoding="utf-8") as fh:
        fh.write(text)
    return {**manifest, **_record_export(actor, tenant, manifest, manifest_sha),
            "dir": str(out)}


def _record_export(actor, tenant: Tenant, manifest: dict, manifest_sha: str) -> dict:
    """The export's ``AuditExport`` row and ``audit.export`` event, in one transaction
    under the tenant's audit head; returns ``{"export", "watermark_moved"}``."""
    size, stone = manifest["through_tree_size"], manifest["through_tombstone"]
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        last = AuditExport.objects.for_tenant(tenant).aggregate(
            seq=Max("through_seq"), tombstone=Max("through_tombstone"),
            size=Max("through_tree_size"))
        last_seq, last_tombstone, last_size = (last["seq"] or 0, last["tombstone"] or 0,
                                               last["size"] or 0)
        moved = size > last_size or stone > last_tombstone
        row = AuditExport.objects.create(
            tenant=tenant, through_seq=manifest["through_seq"], through_tree_size=size,
            through_tombstone=stone, manifest_sha256=manifest_sha)
        audit_record(
            tenant=tenant, actor=actor, action=AuditAction.AUDIT_EXPORT,
            target_type=TargetType.TENANT, target_id=tenant.slug,
            before=({"through_seq": last_seq, "through_tombstone": last_tombstone,
                     "through_tree_size": last_size} if last_seq else None),
            after={"export": row.pk, "through_seq": manifest["through_seq"],
                   "through_tree_size": size, "through_tombstone": stone,
                   "events": manifest["counts"]["events"],
                   "tombstones": manifest["counts"]["tombstones"],
                   "manifest_sha256": manifest_sha, "key_id": manifest["key_id"],
                   "watermark_moved": moved})
    return {"export": row.pk, "watermark_moved": moved}


# --------------------------------------------------------------------------------------
# The four-eyes purge
# --------------------------------------------------------------------------------------

def purge_fingerprint(tenant_id: int, stones: list[tuple[int, uuid.UUID]]) -> str:
    """SHA-256 hex over the tenant and each tombstone's ``id:run_id``, ascending id."""
    text = f"tenant:{tenant_id}\n" + "".join(f"{i}:{r}\n" for i, r in stones)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _free(tenant: Tenant, stones, limit: int) -> list[tuple[int, uuid.UUID]]:
    """(id, run id) of at most ``limit`` of ``stones`` (a queryset of tombstones, in id
    order) no active legal hold covers, by the one coverage rule read over tombstones
    (``selectors.lifecycle.held_tombstones_q``: the run id a runs hold names, even when
    only its tombstone is left; a held subject's run still there; a held subject retention
    copied onto it, ``Tombstone.subjects``). Raises ``PurgeRefused`` (``legal_hold``) when
    a hold covers the whole tenant. Two queries."""
    held = held_tombstones_q(tenant)
    if held is None:
        raise PurgeRefused("a legal hold covers the whole tenant: nothing may be purged",
                           "legal_hold")
    return list(stones.exclude(held).order_by("id").values_list("id", "run_uuid")[:limit])


def _step(purge: TombstonePurge, **extra) -> dict:
    return {"purge": str(purge.uuid), "state": purge.state, **extra}


def tombstone_purge_prepare(*, actor, tenant: Tenant) -> TombstonePurge:
    """Freeze the oldest tombstones a purge may delete (at most ``TOMBSTONE_PURGE_MAX``):
    deleted more than the policy's ``tombstone_retention_days`` ago (database clock),
    id at most the export watermark, their run under no active legal hold. Writes the
    ``TombstonePurge`` (``prepared``; ids, cursors, fingerprint, watermark, deadline now +
    ``PURGE_DEADLINE``) and a ``tombstone_purge.prepare`` event, in one transaction under
    the tenant's audit head.

    Raises ``NotFound``/``Forbidden`` (admin only), ``PurgeRefused``: reason
    ``no_tombstone_retention`` (the policy keeps tombstones forever), ``no_export``,
    ``legal_hold`` (a tenant-wide hold), ``nothing_to_purge``.
    """
    require(actor, tenant, roles.MANAGE)
    days = policy_for(tenant).tombstone_retention_days
    if days is None:
        raise PurgeRefused("the data policy keeps tombstones forever (set "
                           "tombstone_retention_days first)", "no_tombstone_retention")
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        now = db_now()
        _, watermark = export_watermark(tenant)
        if watermark == 0:
            raise PurgeRefused("no export covers a tombstone yet (manage.py export_audit "
                               "first)", "no_export")
        stones = _free(tenant, Tombstone.objects.for_tenant(tenant).filter(
            id__lte=watermark, deleted_at__lte=now - timedelta(days=days)),
            TOMBSTONE_PURGE_MAX)
        if not stones:
            raise PurgeRefused(f"no exported tombstone is older than {days} day(s) and "
                               "free of legal holds", "nothing_to_purge")
        purge = TombstonePurge.objects.create(
            tenant=tenant, uuid=uuid.uuid4(), state=PurgeState.PREPARED,
            first_cursor=stones[0][0], last_cursor=stones[-1][0],
            tombstone_count=len(stones), export_through=watermark,
            tombstone_ids=[i for i, _ in stones],
            fingerprint=purge_fingerprint(tenant.pk, stones),
            deadline=now + PURGE_DEADLINE, prepared_by=actor, prepared_at=now)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.TOMBSTONE_PURGE_PREPARE,
                     target_type=TargetType.TOMBSTONE_PURGE, target_id=purge.uuid,
                     after=_evidence(purge))
    return purge


def _evidence(purge: TombstonePurge) -> dict:
    return _step(purge, tombstones=purge.tombstone_count, first_cursor=purge.first_cursor,
                 last_cursor=purge.last_cursor, export_through=purge.export_through,
                 fingerprint=purge.fingerprint, deadline=purge.deadline.isoformat())


def _locked_purge(tenant: Tenant, purge_id) -> TombstonePurge:
    """The tenant's audit head, then the purge row, locked; ``NotFound`` otherwise."""
    try:
        pid = uuid.UUID(str(purge_id))
    except ValueError:
        raise NotFound("no such tombstone purge") from None
    locks.lock_audit_head(tenant)
    purge = (locks.lock_rows(TombstonePurge.objects.for_tenant(tenant))
             .filter(uuid=pid).first())
    if purge is None:
        raise NotFound("no such tombstone purge")
    return purge


def _decide(*, actor, tenant: Tenant, purge_id, approve: bool, reason: str) -> TombstonePurge:
    require(actor, tenant, roles.APPROVE)
    if not approve:
        # The one rule of a lifecycle reason (holds, erasures, purges): 1..1024 printable
        # bytes (the attack helper's finding: control characters were taken here).
        reason = _lifecycle_reason(reason)
    with transaction.atomic():
        purge = _locked_purge(tenant, purge_id)
        if purge.prepared_by_id == actor.pk:
            raise Forbidden("approver: the preparer may not decide their own tombstone purge")
        if purge.state != PurgeState.PREPARED:
            raise PurgeRefused(f"the purge is {purge.state}, not prepared", "state")
        now = db_now()
        if approve and now >= purge.deadline:
            raise PurgeRefused(f"the approval deadline ({purge.deadline.isoformat()}) has "
                               "passed: prepare again", "expired")
        before = purge.state
        purge.state = PurgeState.APPROVED if approve else PurgeState.REJECTED
        if approve:
            purge.approved_by, purge.approved_at = actor, now
        else:
            purge.rejected_reason = reason
        purge.save(update_fields=["state", "approved_by", "approved_at", "rejected_reason"])
        audit_record(tenant=tenant, actor=actor,
                     action=(AuditAction.TOMBSTONE_PURGE_APPROVE if approve
                             else AuditAction.TOMBSTONE_PURGE_REJECT),
                     target_type=TargetType.TOMBSTONE_PURGE, target_id=purge.uuid,
                     reason=reason, before={"state": before}, after=_evidence(purge))
    return purge


def tombstone_purge_approve(*, actor, tenant: Tenant, purge_id) -> TombstonePurge:
    """Approve a prepared purge (approver role; never its preparer: ``Forbidden``, and a
    database check), before its deadline (database clock). Audited
    (``tombstone_purge.approve``). Raises ``NotFound``, ``Forbidden``, ``PurgeRefused``
    (``state``: not prepared; ``expired``)."""
    return _decide(actor=actor, tenant=tenant, purge_id=purge_id, approve=True, reason="")


def tombstone_purge_reject(*, actor, tenant: Tenant, purge_id, reason: str) -> TombstonePurge:
    """Reject a prepared purge with a reason (1..1024 bytes; approver role, never its
    preparer). Audited (``tombstone_purge.reject``). Raises ``NotFound``, ``Forbidden``,
    ``ReasonRequired``/``InvalidPayload`` (``reason``), ``PurgeRefused`` (``state``)."""
    return _decide(actor=actor, tenant=tenant, purge_id=purge_id, approve=False,
                   reason=reason)


def tombstone_purge_execute(*, actor, tenant: Tenant, purge_id) -> TombstonePurge:
    """Execute an approved purge (admin), fenced: in one transaction under the tenant's
    audit head (so no legal hold, export or deletion of the tenant interleaves), re-checks
    the deadline (database clock), that no active legal hold covers the tenant or a
    frozen tombstone's run, and that the frozen tombstones still there have the prepared
    fingerprint (none deleted, none changed); then deletes exactly them and writes the
    evidence (``executed_by``, ``executed_at``; the row already holds preparer, approver,
    count, cursors, watermark and fingerprint) and a ``tombstone_purge.execute`` event.

    Raises ``NotFound``/``Forbidden`` (admin only), ``PurgeRefused``: ``state`` (not
    approved), ``expired``, ``legal_hold``, ``changed``.
    """
    require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        purge = _locked_purge(tenant, purge_id)
        if purge.state != PurgeState.APPROVED:
            raise PurgeRefused(f"the purge is {purge.state}, not approved", "state")
        now = db_now()
        if now >= purge.deadline:
            raise PurgeRefused(f"the deadline ({purge.deadline.isoformat()}) has passed: "
                               "prepare again", "expired")
        frozen = Tombstone.objects.for_tenant(tenant).filter(id__in=purge.tombstone_ids)
        held = frozen.count() - len(_free(tenant, frozen, purge.tombstone_count))
        if held:
            raise PurgeRefused(f"a legal hold placed since the preparation covers {held} of "
                               "the frozen tombstones", "legal_hold")
        present = list(frozen.order_by("id").values_list("id", "run_uuid"))
        if purge_fingerprint(tenant.pk, present) != purge.fingerprint:
            raise PurgeRefused("the frozen tombstones changed since the preparation "
                               f"({len(present)} of {purge.tombstone_count} still there)",
                               "changed")
        deleted, _ = frozen.delete()
        purge.state, purge.executed_by, purge.executed_at = PurgeState.EXECUTED, actor, now
        purge.save(update_fields=["state", "executed_by", "executed_at"])
        audit_record(tenant=tenant, actor=actor, action=AuditAction.TOMBSTONE_PURGE_EXECUTE,
                     target_type=TargetType.TOMBSTONE_PURGE, target_id=purge.uuid,
                     before={"state": PurgeState.APPROVED},
                     after=_evidence(purge) | {"tombstones": deleted})
    return purge

