"""The core of every deletion (issue 20; DESIGN.md 3a; docs/security/retention.md).

Retention (``services.retention``) and erasure (``services.erasure``) both end here:
``purge_run_payloads`` deletes one run's payloads and history and writes its tombstone
and its audit event in the caller's transaction, after ``run_blockers`` said nothing
stops it. One rule, one place: a run is deleted only when it is ended (``completed`` or
``closed``), has no effect in doubt, is under no active legal hold, and was not deleted
before.

What "payloads and history" means: the run's checkpoints and their revisions, its
LangGraph checkpoints and pending writes (deleted); the refused payloads kept with its
conflicts, its effects' requests and receipts (current and history) and its reconcile
evidence (blanked: the rows stay, so operation keys keep their idempotency window until
the effect retention expires them, ``services.retention``). The run row stays, its
``payloads_deleted_at`` set: the run page says what happened and writes are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Q

from ..audit import audit_record
from ..jsonparse import text_problem
from ..models import (
    Checkpoint,
    CheckpointRevision,
    Conflict,
    DataPolicy,
    Effect,
    EffectRevision,
    GraphCheckpoint,
    GraphWrite,
    LegalHold,
    ReconcileAttempt,
    Run,
    RunSubject,
    Tenant,
    Tombstone,
)
from ..selectors.lifecycle import held_runs_q as held_runs_q  # the rule's home
from ..selectors.lifecycle import held_tombstones_q as held_tombstones_q
from ..vocab import AuditAction, DeletionCause, EffectState, RecoveryState, TargetType

#: The recovery states in which a run has ended (retention and erasure may delete it).
ENDED = frozenset({RecoveryState.COMPLETED, RecoveryState.CLOSED})
SUBJECT_DIGEST_LABEL = b"recovery.subject.v1"


class Blocker:
    """Why a run may not be deleted now (``run_blockers``): stable words for the API."""

    NOT_ENDED = "not_ended"
    IN_DOUBT = "effect_in_doubt"
    HELD = "legal_hold"
    DELETED = "already_deleted"


def policy_for(tenant: Tenant | int) -> DataPolicy:
    """The tenant's ``DataPolicy`` row, or an unsaved one with the defaults (nothing is
    deleted, secrets are warned about) when its admin never set one. One query."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    row = DataPolicy.objects.for_tenant(tenant_id).first()
    return row if row is not None else DataPolicy(tenant_id=tenant_id)


def subject_digest(tenant: Tenant | int, field: str, value: str) -> str:
    """The keyed digest of a subject's identity value (64 hex digits): HMAC-SHA256 keyed
    with ``SECRET_KEY`` over the label, the tenant id, the field name and the value, so
    the store can find a subject's runs without holding the value, and a reader of the
    table cannot confirm a guessed customer id without the key."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    key = hmac.new(settings.SECRET_KEY.encode(), SUBJECT_DIGEST_LABEL, hashlib.sha256).digest()
    message = f"{tenant_id}\x00{field}\x00{value}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def subject_value(value) -> str | None:
    """The text a subject value is indexed, held and erased under, or ``None`` when
    ``value`` is no subject value. The one rule of the subject index (``subject_rows``,
    the write path) and of a hold's or an erasure request's ``subject.value``
    (``services.holds``), so every value a write indexes can be held and erased by
    value, and a value refused there is one no write ever indexed:

    - a string (``str``) of at least one character, valid text (``jsonparse.
      text_problem``: no U+0000, no unpaired surrogate; a written payload holds neither),
      as it is: not stripped, case-folded nor normalised (``"A@x.com "`` and ``"a@x.com"``
      are two subjects). No length bound of its own: a write can index any string its
      body carries (``RECOVERY_MAX_BODY_BYTES``, 1 MiB), so a hold or an erasure takes
      any string its body carries (issue: a 257-character value was indexed but could be
      neither held nor erased by value);
    - an integer (``int``, not a boolean), as its decimal digits (``42`` and ``"42"``
      are the same subject).

    ``""`` identifies nobody (erasing "every run whose customer id is empty" would erase
    unrelated people's runs), so it is never indexed. Anything else (``None``, a
    boolean, a float, an object, a list) is ``None``. Pure: no query."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str) or not value or text_problem(value):
        return None
    return value


def pointer_resolve(document, pointer: str):
    """The value RFC 6901 JSON pointer ``pointer`` names in ``document`` (``""``: the
    whole document; ``~1`` is ``/`` and ``~0`` is ``~`` in a token; an array index is
    ``0`` or digits without a leading zero), or ``MISSING`` when it names nothing."""
    if pointer == "":
        return document
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        return MISSING
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(document, dict):
            if token not in document:
                return MISSING
            document = document[token]
        elif isinstance(document, list):
            # RFC 6901: "0" or [1-9][0-9]*, ASCII digits only ("²".isdigit() is True,
            # and int("١") is 1: an attack's finding).
            if not (token.isascii() and token.isdigit()) \
                    or (token != "0" and token.startswith("0")) or int(token) >= len(document):
                return MISSING
            document = document[int(token)]
        else:
            return MISSING
    return document


MISSING = object()


def subject_rows(*, tenant: Tenant | int, run_pk: int, payload,
                 fields: dict | str | None) -> list[RunSubject]:
    """The ``RunSubject`` rows (unsaved) of a checkpoint ``payload`` written to run
    ``run_pk``, by its tenant's declared subject fields (``fields``:
    ``DataPolicy.subject_fields``, name -> JSON pointer, a dict or its JSON text as the
    write path read it with the run's lock): one per pointer that resolves to a subject
    value (``subject_value``: a non-empty string or an integer, a boolean is neither),
    holding the field's name and the value's keyed digest, never the value. No query."""
    if isinstance(fields, str):  # a jsonb column read as text
        fields = json.loads(fields)
    if not fields or not isinstance(fields, dict):
        return []
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    rows = []
    for name, pointer in fields.items():
        value = subject_value(pointer_resolve(payload, pointer))
        if value is None:
            continue
        rows.append(RunSubject(tenant_id=tenant_id, run_id=run_pk, field=name,
                               digest=subject_digest(tenant_id, name, value)))
    return rows


def subjects_index(*, tenant: Tenant | int, run_pk: int, payload, fields: dict | None) -> int:
    """Index a checkpoint ``payload`` written to run ``run_pk`` by its tenant's declared
    subject fields: the rows of ``subject_rows`` upserted (already indexed ones are
    kept). No query when none resolves, else one. Inside the write's transaction.
    Returns how many digests were offered."""
    rows = subject_rows(tenant=tenant, run_pk=run_pk, payload=payload, fields=fields)
    if rows:
        RunSubject.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def active_holds(tenant: Tenant | int):
    """The tenant's holds not released (a queryset)."""
    return LegalHold.objects.for_tenant(tenant).filter(released_at__isnull=True)


def runs_blockers(tenant: Tenant | int, runs: list[Run], *,
                  deleted_ok: bool = False) -> dict[int, list[str]]:
    """Why each of ``runs`` (runs of ``tenant``) may not be deleted now: run pk ->
    ``Blocker`` words, in that order (``[]``: nothing stops it). The one judgement of a
    deletion (issue 20; DESIGN.md 3a), set-based: at most three queries whatever the
    number of runs (the effects in doubt; the tenant-wide hold check and the held runs,
    ``selectors.lifecycle.held_runs_q``, the coverage rule's home), none without runs.
    Under the runs' locks (``locks.lock_run``/``lock_runs``) the answer holds until
    commit; without them (an erasure's preview) it is what they would say now.
    ``deleted_ok``: a run whose payloads are already deleted is judged on the other rules
    (the retention purge's second phase, which expires what such a run has left)."""
    out: dict[int, list[str]] = {}
    judged = []
    for run in runs:
        if run.payloads_deleted_at is not None and not deleted_ok:
            out[run.pk] = [Blocker.DELETED]
        else:
            out[run.pk] = [] if run.recovery_state in ENDED else [Blocker.NOT_ENDED]
            judged.append(run.pk)
    if not judged:
        return out
    doubtful = set(Effect.objects.for_tenant(tenant).filter(
        run_id__in=judged, state__in=EffectState.DOUBTFUL).values_list("run_id", flat=True))
    held = held_runs_q(tenant)
    held_pks = (set(judged) if held is None else set(
        Run.objects.for_tenant(tenant).filter(held, pk__in=judged)
        .values_list("pk", flat=True)))
    for pk in judged:
        if pk in doubtful:
            out[pk].append(Blocker.IN_DOUBT)
        if pk in held_pks:
            out[pk].append(Blocker.HELD)
    return out


def run_blockers(run: Run, *, deleted_ok: bool = False) -> list[str]:
    """Why ``run`` may not be deleted now (``Blocker`` words, in that order), or ``[]``:
    ``runs_blockers`` of this one run (at most three queries). Call it under the run's
    lock (``locks.lock_run``) so the answer holds until commit. ``deleted_ok``: as
    ``runs_blockers``."""
    return runs_blockers(run.tenant_id, [run], deleted_ok=deleted_ok)[run.pk]


class NotDeletable(Exception):
    """``purge_run_payloads`` refused: ``blockers`` (``Blocker`` words) say why."""

    def __init__(self, blockers: list[str]):
        super().__init__(", ".join(blockers))
        self.blockers = blockers


@dataclass(frozen=True)
class Purged:
    """What ``purge_run_payloads`` did: the tombstone written and the counts it holds."""

    tombstone: Tombstone
    counts: dict[str, int]


def purge_run_payloads(*, actor, tenant: Tenant, run: Run, now: datetime, cause: str,
                       policy: dict, erasure=None) -> Purged:
    """Delete ``run``'s payloads and history and write its ``Tombstone`` and one audit
    event (``run.purge`` for retention, ``run.erase`` for erasure; ``after`` holds the
    tombstone's id and the counts, never a value), in the caller's transaction.

    ``run`` must be locked by the caller (``locks.lock_run``); the rule is judged here,
    under that lock, once: raises ``NotDeletable`` (its ``blockers``, nothing written)
    when ``run_blockers(run)`` names anything, so no caller can delete past it. ``now``
    is the database time read with the lock; ``policy`` the numbers or ids that decided
    it (``{"payload_retention_days": 30}``, ``{"erasure_request": "<uuid>"}``).
    """
    assert cause in DeletionCause.values
    blockers = run_blockers(run)
    if blockers:
        raise NotDeletable(blockers)
    t = tenant
    checkpoints = Checkpoint.objects.for_tenant(t).filter(run_id=run.pk)
    effects = Effect.objects.for_tenant(t).filter(run_id=run.pk)
    counts = {
        "checkpoints": checkpoints.count(),
        "revisions": CheckpointRevision.objects.for_tenant(t)
        .filter(checkpoint__run_id=run.pk).count(),
        "graph_checkpoints": GraphCheckpoint.objects.for_tenant(t).filter(run_id=run.pk).count(),
        "effects": effects.count(),
    }
    GraphWrite.objects.for_tenant(t).filter(graph_checkpoint__run_id=run.pk).delete()
    # An erasure unlinks the subject: its index goes with the payloads, and its tombstone
    # names no subject. Retention keeps the index until the run's records expire (a
    # subject's legal hold still covers what is left) and copies it onto the tombstone, so
    # the hold keeps the tombstone too (``services.tombstones``).
    subject_rows = RunSubject.objects.for_tenant(t).filter(run_id=run.pk)
    if cause == DeletionCause.ERASURE:
        subject_rows.delete()
        subjects = []
    else:
        subjects = [list(r) for r in subject_rows.order_by("field", "digest")
                    .values_list("field", "digest")]
    GraphCheckpoint.objects.for_tenant(t).filter(run_id=run.pk).delete()
    Run.objects.for_tenant(t).filter(pk=run.pk).update(latest_checkpoint=None)
    CheckpointRevision.objects.for_tenant(t).filter(checkpoint__run_id=run.pk).delete()
    checkpoints.delete()
    counts["conflict_payloads"] = (Conflict.objects.for_tenant(t).filter(run_id=run.pk)
                                   .exclude(refused_ciphertext="")
                                   .update(refused_ciphertext=""))
    counts["receipts"] = (effects.filter(~Q(receipt_ciphertext="") | ~Q(request_ciphertext=""))
                          .update(receipt_ciphertext="", request_ciphertext=""))
    EffectRevision.objects.for_tenant(t).filter(effect__run_id=run.pk).exclude(
        receipt_ciphertext="").update(receipt_ciphertext="")
    counts["evidence"] = (ReconcileAttempt.objects.for_tenant(t)
                          .filter(request__run_id=run.pk).exclude(evidence_ciphertext="")
                          .update(evidence_ciphertext=""))
    tombstone = Tombstone.objects.create(
        tenant=t, run_uuid=run.uuid, kind=run.kind, schema_version=run.schema_version,
        final_state=run.recovery_state, cause=cause, run_created_at=run.created_at,
        ended_at=run.closed_at or run.state_changed_at, deleted_at=now, policy=policy,
        counts=counts, erasure=erasure, subjects=subjects)
    Run.objects.for_tenant(t).filter(pk=run.pk).update(
        payloads_deleted_at=now, latest_checkpoint=None, phase_label="")
    run.payloads_deleted_at = now
    action = AuditAction.RUN_PURGE if cause == DeletionCause.RETENTION else AuditAction.RUN_ERASE
    audit_record(tenant=t, actor=actor, action=action, target_type=TargetType.RUN,
                 target_id=run.uuid, run_id=run.uuid,
                 after={"tombstone": tombstone.pk, "cause": cause, "policy": policy,
                        "counts": counts}, created_at=now)
    return Purged(tombstone=tombstone, counts=counts)
