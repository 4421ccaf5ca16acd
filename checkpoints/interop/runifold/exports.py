"""``runifold_export``: a tenant's runifold checkpoints and effect records as runifold
JSON Lines (issue 10, item 4; ``docs/runifold.md``, "Export"), page by page, each page
read, decrypted and audited (``runifold.export``) in one transaction and written out
after it commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce

from ... import crypto, roles
from ...audit import audit_record
from ...exceptions import Forbidden, InvalidPayload, NotFound
from ...jsonparse import dumps, loads_any
from ...models import Checkpoint, CheckpointRevision, Effect, EffectRevision, Run, Tenant
from ...permissions import require, tenant_perms
from ...vocab import AuditAction, PhaseClass, TargetType
from .lines import KINDS, _request, execution_id, status_out

# --------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------

@dataclass
class ExportReport:
    """What an export wrote: ``checkpoint_lines``, ``effect_lines``; and what it left out
    because runifold has no shape for it: checkpoints of other kinds or of a schema the
    registry refuses (``left_out_checkpoints``), effects written through the API without
    a runifold request (``left_out_effects``); with ``history``, the revisions of exported
    checkpoints up to and including their last unsupported (schema-mismatch) revision
    (``left_out_revisions``: a checkpoint's history starts after it, so the lines of one
    checkpoint have no gap an import would refuse)."""

    checkpoint_lines: int = 0
    effect_lines: int = 0
    left_out_checkpoints: int = 0
    left_out_effects: int = 0
    left_out_revisions: int = 0


#: Rows per page, and payload bytes per page of checkpoints (at least one row).
EXPORT_PAGE = 200
EXPORT_PAGE_BYTES = 8 << 20


def _envelope_line(cid, run_uuid, revision, kind, schema_version, payload_text,
                   updated_at_ms) -> str:
    """The envelope as ``dumps`` writes it (sorted keys, compact); the payload text is
    stored canonical already (``parse_envelope``), so it is put in as it is."""
    return (f'{{"id":"{cid}","kind":{dumps(kind)},"payload":{payload_text},'
            f'"revision":{revision},"run_id":"{run_uuid}","schema_version":{schema_version},'
            f'"updated_at_ms":{updated_at_ms}}}')


def runifold_export(*, actor, tenant: Tenant, write: Callable[[str], None],
                    run_ids: Iterable[uuid.UUID] | None = None, history: bool = False,
                    page_size: int = EXPORT_PAGE,
                    on_progress: Callable[[int], None] | None = None) -> ExportReport:
    """Write ``tenant``'s runifold checkpoints and effect records as JSON Lines, one
    ``write(line)`` per line (no newline), checkpoints first (module doc,
    ``docs/runifold.md``): the latest revision of each, or every stored revision oldest
    first with ``history`` (after the checkpoint's last unsupported revision, if any:
    ``ExportReport.left_out_revisions``); then each effect's current record (or every
    revision).
    ``run_ids`` limits the export to those runs.

    Each page (``page_size`` rows, and at most 8 MiB of checkpoint payloads) is read,
    decrypted and audited (``runifold.export``, target the tenant) in one transaction;
    its lines are written after that commits, so nothing leaves unaudited. ``actor``
    needs a role that may read payloads (``write_runs`` or ``reveal_payload``), or is
    ``None`` for the operator's command line. ``on_progress(lines)`` after each page.
    Raises ``NotFound`` naming ``run_id`` for a run the tenant does not have,
    ``Forbidden``/``NotFound`` as ``permissions.require``.
    """
    # Long on purpose: one streaming pass (runs, then their checkpoints and effects,
    # page by page) sharing its cursors and counts; split, pages would be read twice.
    if actor is not None:
        require(actor, tenant, roles.VIEW)
        if not tenant_perms(actor, tenant) & {roles.WRITE, roles.REVEAL}:
            raise Forbidden("your role may not read payloads")
    if type(page_size) is not int or not 1 <= page_size <= 10_000:
        raise InvalidPayload("page_size: must be an integer in 1..10000")
    report = ExportReport()
    run_pks = None
    if run_ids is not None:
        wanted = set(run_ids)
        found = dict(Run.objects.for_tenant(tenant).filter(uuid__in=wanted)
                     .values_list("uuid", "pk"))
        missing = sorted(str(u) for u in wanted - set(found))
        if missing:
            raise NotFound(f"run_id: no run {missing[0]} in tenant {tenant.slug}")
        run_pks = list(found.values())

    def audit_page(checkpoint_lines: int, effect_lines: int) -> None:
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RUNIFOLD_EXPORT,
                     target_type=TargetType.TENANT, target_id=tenant.slug,
                     after={"checkpoint_lines": checkpoint_lines,
                            "effect_lines": effect_lines, "history": history})

    def emit(lines: list[str]) -> None:
        for line in lines:
            write(line)
        if on_progress is not None:
            on_progress(len(lines))

    cps = Checkpoint.objects.for_tenant(tenant)
    effects = Effect.objects.for_tenant(tenant)
    if run_pks is not None:
        cps = cps.filter(run_id__in=run_pks)
        effects = effects.filter(run_id__in=run_pks)
    exported = cps.filter(kind__in=KINDS).exclude(phase_class=PhaseClass.UNSUPPORTED)
    report.left_out_checkpoints = cps.count() - exported.count()

    # Checkpoints: pages of rows in primary key order (a checkpoint's revisions are
    # inserted oldest first, so its lines come oldest first too).
    if history:
        # Each exported checkpoint's revisions after its last unsupported one: the
        # revisions ending at the current one with no gap (an import refuses a gap).
        revisions = CheckpointRevision.objects.for_tenant(tenant).filter(checkpoint__in=exported)
        last_unsupported = (CheckpointRevision.objects.for_tenant(tenant)
                            .filter(checkpoint_id=OuterRef("checkpoint_id"),
                                    phase_class=PhaseClass.UNSUPPORTED)
                            .order_by("-revision").values("revision")[:1])
        source = revisions.filter(revision__gt=Coalesce(Subquery(last_unsupported), -1))
        report.left_out_revisions = revisions.count() - source.count()
        columns = ("checkpoint__uuid", "checkpoint__run__uuid")
    else:
        source = exported
        columns = ("uuid", "run__uuid")
    last = 0
    while True:
        sizes = list(source.filter(pk__gt=last).order_by("pk")
                     .values_list("pk", "payload_size")[:page_size])
        if not sizes:
            break
        chosen, total = [], 0
        for pk, size in sizes:
            if chosen and total + size > EXPORT_PAGE_BYTES:
                break
            chosen.append(pk)
            total += size
        last = chosen[-1]
        with transaction.atomic():
            rows = (source.filter(pk__in=chosen).order_by("pk")
                    .values_list(*columns, "revision", "kind", "schema_version",
                                 "payload_ciphertext", "updated_at_ms"))
            lines = [_envelope_line(cid, run_uuid, rev, kind, sv,
                                    crypto.decrypt_text(ct, tenant=tenant), ms)
                     for cid, run_uuid, rev, kind, sv, ct, ms in rows]
            audit_page(len(lines), 0)
        report.checkpoint_lines += len(lines)
        emit(lines)

    # Effects: those that carry a runifold request, in primary key order.
    last = 0
    while True:
        with transaction.atomic():
            rows = list(effects.filter(pk__gt=last).order_by("pk")
                        .values_list("pk", "uuid", "run__uuid", "revision", "state",
                                     "receipt_ciphertext", "request_ciphertext")[:page_size])
            if not rows:
                break
            last = rows[-1][0]
            lines, left_out = _effect_lines(tenant, rows, history)
            report.left_out_effects += left_out
            if lines:
                audit_page(0, len(lines))
        report.effect_lines += len(lines)
        emit(lines)
    return report


def _runifold_request(tenant: Tenant, effect_id: uuid.UUID, ciphertext: str) -> dict | None:
    """The stored request if it is a runifold ``EffectRequest`` of this effect, else
    ``None`` (an effect written through the API)."""
    if not ciphertext:
        return None
    try:
        request = loads_any(crypto.decrypt_text(ciphertext, tenant=tenant))
        if _request(request)[0] != str(effect_id):
            return None
    except (InvalidPayload, ValueError, TypeError):
        return None
    return request


def _effect_lines(tenant: Tenant, rows: list, history: bool) -> tuple[list[str], int]:
    requests = {}
    for pk, eid, _, _, _, _, ciphertext in rows:
        request = _runifold_request(tenant, eid, ciphertext)
        if request is not None:
            requests[pk] = request
    # A line needs run_id unless its agent key leads an import back to its run: the
    # execution id is a runifold checkpoint of the same run (exported above).
    exec_ids = {pk: execution_id(r.get("idempotency_key")) for pk, r in requests.items()}
    wanted = {x for x in exec_ids.values() if x is not None}
    derived = dict(Checkpoint.objects.for_tenant(tenant)
                   .filter(uuid__in=wanted, kind__in=KINDS)
                   .exclude(phase_class=PhaseClass.UNSUPPORTED)
                   .values_list("uuid", "run__uuid")) if wanted else {}
    revisions: dict[int, list] = {}
    if history and requests:
        for effect_pk, rev, state, receipt in (
                EffectRevision.objects.for_tenant(tenant).filter(effect_id__in=list(requests))
                .order_by("effect_id", "revision")
                .values_list("effect_id", "revision", "state", "receipt_ciphertext")):
            revisions.setdefault(effect_pk, []).append((rev, state, receipt))
    lines = []
    for pk, _, run_uuid, revision, state, receipt, _ in rows:
        request = requests.get(pk)
        if request is None:
            continue
        records = revisions.get(pk, []) if history else [(revision, state, receipt)]
        for rev, st, rc in records:
            record: dict[str, Any] = {
                "revision": rev, "request": request,
                "status": status_out(st, loads_any(crypto.decrypt_text(rc, tenant=tenant)) if rc else None,
                                     rev)}
            if derived.get(exec_ids[pk]) != run_uuid:
                record["run_id"] = str(run_uuid)
            lines.append(dumps(record))
    return lines, len(rows) - len(requests)
