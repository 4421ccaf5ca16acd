"""Retention per tenant (issue 20, item 1; DESIGN.md 3a; docs/security/retention.md): the
tenant admin's data policy (``data_policy_set``) and the scheduled purge that applies it
(``retention_purge``, ``retention_purge_all``: Celery beat with a broker, the in-process
worker without one, ``manage.py purge_expired``).

The purge has two phases, each a series of short transactions, one run each, under the
tenant's fenced cleanup lease (``CleanupLease``):

1. **Payloads.** An ended run (``completed``/``closed``) whose end (``closed_at``, else
   ``state_changed_at``) is older than ``payload_retention_days`` on the database clock,
   not held, with no effect in doubt, loses its payloads and history through the one
   deletion core (``lifecycle.purge_run_payloads``: tombstone and ``run.purge`` event in
   the same transaction). Its effect rows stay, receipts blanked: their operation keys
   keep answering ``operation_exists`` (the idempotency window).
2. **Effect records.** A run whose payloads are deleted (by retention or erasure) and
   whose end is older than ``effect_retention_days`` (never shorter than the restart
   interval: ``data_policy_set`` refuses it) loses what is left: its effects and their
   revisions, conflicts, retry and reconcile requests, transitions, resume decisions,
   subject digests, then the run row itself (``run.expire`` event with the counts; the
   state counters follow through migration 0011's triggers). The tombstone stays. With
   ``effect_retention_days`` unset (the default) this phase does nothing: effect records
   and operation keys are kept forever.

A legal hold wins over both phases; so does an effect in doubt. Each run's transaction
takes the store's lock order (``locks``: the tenant's audit head, then the run), renews
the lease with a conditional ``UPDATE`` naming its fencing token (0 rows: another purger
took over; this one stops before writing), and judges the rule again under the lock.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from .. import heartbeat, locks, roles
from ..audit import audit_record
from ..dbclock import NOW, db_now
from ..exceptions import InvalidPayload
from ..jsonparse import name_problem, padding_problem, text_problem
from ..models import (
    CleanupLease,
    Conflict,
    DataPolicy,
    Effect,
    EffectRevision,
    ReconcileAttempt,
    ReconcileRequest,
    ResumeDecision,
    RetryRequest,
    Run,
    RunSubject,
    RunTransition,
    Tenant,
)
from ..models.lifecycle import (
    PAYLOAD_FLAG_BYTES_MAX,
    RESTART_INTERVAL_S_MAX,
    RETENTION_DAYS_MAX,
    SUBJECT_FIELDS_MAX,
)
from ..permissions import require
from ..vocab import AuditAction, DeletionCause, EffectState, HoldScope, SecretsPolicy, TargetType
from .common import _actor_name
from .lifecycle import (
    ENDED,
    NotDeletable,
    active_holds,
    held_runs_q,
    policy_for,
    purge_run_payloads,
    run_blockers,
)

#: The policy's fields, in the order the API and the audit event list them.
POLICY_FIELDS = ("payload_retention_days", "effect_retention_days", "restart_interval_s",
                 "tombstone_retention_days", "secrets_policy", "payload_flag_bytes",
                 "subject_fields")
SUBJECT_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
#: The longest JSON pointer a subject field may name (characters).
POINTER_MAX = 512
_POINTER_RE = re.compile(r"(/([^~/]|~[01])*)*\Z")
#: The most runs one batch of the purge looks at (RUNIFOLD.md 5: "<= 1,000 per batch").
BATCH_MAX = 1000
#: How long a purger holds the tenant's cleanup lease without renewing it (seconds);
#: every run it deletes renews it.
LEASE_TTL_S = 300
DAY_S = 86_400
log = logging.getLogger(__name__)

#: The heartbeat of a cross-tenant purge in which every tenant's purge finished
#: (``retention_purge_all``): ``/readyz`` judges its age (``retention_health``).
HEARTBEAT = "retention"
#: The heartbeat of a cross-tenant purge that ran, whether every tenant's finished or
#: not: what makes the next round due (so a tenant that keeps failing is tried once an
#: interval, not on every sweep).
ROUND_HEARTBEAT = "retention.round"


class RetentionLate(Exception):
    """No retention round finished for every tenant within its bound (``/readyz``)."""


# --------------------------------------------------------------------------------------
# The data policy
# --------------------------------------------------------------------------------------

def _int_or_none(value, field: str, lo: int, hi: int, *, nullable: bool = True):
    if value is None and nullable:
        return None
    if type(value) is not int or not lo <= value <= hi:
        null = " or null" if nullable else ""
        raise InvalidPayload(f"{field}: must be an integer in {lo}..{hi}{null}")
    return value


def subject_pointer_problem(pointer: str) -> str:
    """Why ``pointer`` can be no subject field's new pointer beyond RFC 6901's syntax
    ("" if it can): a name's rule (``jsonparse.name_problem``: no control character, tab
    and line breaks included, no bidirectional control, no invisible character) and no
    leading or trailing whitespace. A pointer is one line that a person reads and that the
    Data page's form shows and sends back as it is: ``"/a\\nb"`` takes two lines of it,
    ``"/\\u202e"`` shows turned around, ``"/customer id "`` shows as ``/customer id``,
    another payload key (stop 34's attack). The one rule of the API and the Data page alike
    (``_subject_fields``)."""
    return name_problem(pointer) or padding_problem(pointer)


def _subject_fields(value, kept: dict[str, str]) -> dict[str, str]:
    """The checked ``subject_fields``: names ``SUBJECT_NAME_RE`` -> RFC 6901 pointers of
    at most ``POINTER_MAX`` characters that ``subject_pointer_problem`` passes. A pair
    ``kept`` already holds (the stored policy) is not judged by ``subject_pointer_problem``
    again: a pointer stored before that rule stays until the admin changes or removes it,
    so no other field of the policy is locked behind it (and it is never rewritten)."""
    if not isinstance(value, dict):
        raise InvalidPayload("subject_fields: must be an object of field name -> JSON pointer")
    if len(value) > SUBJECT_FIELDS_MAX:
        raise InvalidPayload(f"subject_fields: at most {SUBJECT_FIELDS_MAX} fields")
    out = {}
    for name, pointer in value.items():
        if not isinstance(name, str) or not SUBJECT_NAME_RE.match(name):
            raise InvalidPayload(f"subject_fields: {str(name)[:64]!r} is not a field name "
                                 "([a-z][a-z0-9_]{0,63})")
        where = f"subject_fields.{name}"
        if not isinstance(pointer, str):
            raise InvalidPayload(f"{where}: must be a JSON pointer string (RFC 6901)")
        if len(pointer) > POINTER_MAX:
            raise InvalidPayload(f"{where}: at most {POINTER_MAX} characters")
        problem = text_problem(pointer)
        if not problem and kept.get(name) != pointer:
            problem = subject_pointer_problem(pointer)
        if problem:
            raise InvalidPayload(f"{where}: {problem}")
        if not pointer or not _POINTER_RE.match(pointer):
            raise InvalidPayload(f"{where}: not a JSON pointer (RFC 6901: '/a/b', ~0 for ~ "
                                 "and ~1 for /; the whole document '' is no identity)")
        out[name] = pointer
    return dict(sorted(out.items()))


def data_policy_check(fields: dict, current: DataPolicy) -> dict:
    """The policy ``current`` becomes with ``fields`` (any subset of ``POLICY_FIELDS``;
    one left out keeps its value), checked whole: retention days 1..``RETENTION_DAYS_MAX``
    or null (forever), ``restart_interval_s`` 1..``RESTART_INTERVAL_S_MAX``, an effect
    retention never shorter than the restart interval (the idempotency window: a key must
    outlive every retry that could reuse it; DESIGN.md 3a), ``secrets_policy`` a
    ``SecretsPolicy``, ``payload_flag_bytes`` 1..2^31-1 or null, ``subject_fields`` at
    most ``SUBJECT_FIELDS_MAX`` names ``[a-z][a-z0-9_]{0,63}`` -> RFC 6901 pointers of at
    most ``POINTER_MAX`` characters, each new or changed one one printable line without
    surrounding whitespace (``subject_pointer_problem``; a pair ``current`` holds is kept
    as it is). Returns every field's value; raises
    ``InvalidPayload`` naming the first bad field. Reads nothing."""
    unknown = sorted(set(fields) - set(POLICY_FIELDS))
    if unknown:
        raise InvalidPayload(f"{unknown[0]}: unknown field (the policy's fields: "
                             f"{', '.join(POLICY_FIELDS)})")
    v = {name: getattr(current, name) for name in POLICY_FIELDS}
    v.update(fields)
    for name in ("payload_retention_days", "effect_retention_days",
                 "tombstone_retention_days"):
        v[name] = _int_or_none(v[name], name, 1, RETENTION_DAYS_MAX)
    v["restart_interval_s"] = _int_or_none(v["restart_interval_s"], "restart_interval_s", 1,
                                           RESTART_INTERVAL_S_MAX, nullable=False)
    v["payload_flag_bytes"] = _int_or_none(v["payload_flag_bytes"], "payload_flag_bytes", 1,
                                           PAYLOAD_FLAG_BYTES_MAX)
    if v["secrets_policy"] not in SecretsPolicy.values:
        raise InvalidPayload(f"secrets_policy: must be one of {', '.join(SecretsPolicy.values)}")
    v["subject_fields"] = _subject_fields(v["subject_fields"], current.subject_fields or {})
    effect_days = v["effect_retention_days"]
    if effect_days is not None and effect_days * DAY_S < v["restart_interval_s"]:
        raise InvalidPayload(
            f"effect_retention_days: {effect_days} day(s) is shorter than the restart "
            f"interval ({v['restart_interval_s']} s): an operation key must outlive every "
            "retry that could reuse it (the idempotency window); keep effects longer or "
            "declare a shorter restart interval")
    return v


def _keep_held_subject_fields(tenant: Tenant, old: dict, new: dict) -> None:
    """Refuse a policy that removes or re-points a subject field an active legal hold
    names: runs written after it would no longer be indexed under the field, so the hold
    would silently stop covering them (the newcomer's finding). Raises
    ``InvalidPayload`` naming ``subject_fields.<name>``."""
    changed = {name for name, pointer in old.items() if new.get(name) != pointer}
    if not changed:
        return
    held = sorted(set(active_holds(tenant).filter(scope=HoldScope.SUBJECT,
                                                  subject_field__in=changed)
                      .values_list("subject_field", flat=True)))
    if held:
        raise InvalidPayload(f"subject_fields.{held[0]}: an active legal hold covers this "
                             "subject field; release the hold before removing or "
                             "changing its pointer")


def data_policy_set(*, actor, tenant: Tenant, **fields) -> tuple[DataPolicy, bool]:
    """Set ``tenant``'s data policy (``PUT …/data-policy``, the Data page's form):
    ``fields`` is any subset of ``POLICY_FIELDS``, checked by ``data_policy_check``.
    Returns ``(policy, changed)``; the same values again write nothing and audit nothing
    (``changed`` false).

    ``actor``: the tenant's admin (``roles.MANAGE``), or ``None`` for the operator.
    Raises ``Forbidden``/``NotFound`` (rights), ``InvalidPayload`` naming the field. One
    transaction under the tenant's audit head: the upsert of the ``DataPolicy`` row and
    one ``data_policy.set`` event whose ``before``/``after`` hold the numbers, the
    secrets policy and the subject field names with their pointers (never a payload
    value)."""
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        current = policy_for(tenant)
        values = data_policy_check(fields, current)
        before = {name: getattr(current, name) for name in POLICY_FIELDS}
        if values == before:
            return current, False
        _keep_held_subject_fields(tenant, before["subject_fields"] or {},
                                  values["subject_fields"] or {})
        stored = current._state.adding is False
        rows = DataPolicy.objects.for_tenant(tenant)
        if stored:
            rows.filter(pk=tenant.pk).update(**values, updated_at=Now(),
                                             updated_by_name=_actor_name(actor))
        else:
            DataPolicy.objects.create(tenant=tenant, **values, updated_by_name=_actor_name(actor))
        audit_record(tenant=tenant, actor=actor, action=AuditAction.DATA_POLICY_SET,
                     target_type=TargetType.DATA_POLICY, target_id=tenant.slug[:64],
                     before=before if stored else None, after=values)
        row = rows.get(pk=tenant.pk)
    return row, True


# --------------------------------------------------------------------------------------
# The fenced cleanup lease
# --------------------------------------------------------------------------------------

def _lease_take(tenant: Tenant | int, holder: str) -> int | None:
    """Take ``tenant``'s cleanup lease for ``holder`` (``LEASE_TTL_S``, database time)
    when it is free or expired, in its own transaction (one row, waiting for nothing
    else: outside the lock order like a reconcile claim). Returns the new fencing token,
    or ``None`` while another purger's lease is live."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    leases = CleanupLease.objects.for_tenant(tenant_id)
    until = NOW + timedelta(seconds=LEASE_TTL_S)
    for _ in range(2):
        with transaction.atomic():
            free = Q(expires_at__isnull=True) | Q(expires_at__lte=NOW)
            lease = leases.filter(pk=tenant_id).values_list("token", flat=True).first()
            if lease is not None:
                taken = leases.filter(free, pk=tenant_id, token=lease).update(
                    holder=holder[:64], token=lease + 1, expires_at=until)
                return lease + 1 if taken == 1 else None
        try:
            with transaction.atomic():
                CleanupLease.objects.create(tenant_id=tenant_id, holder=holder[:64], token=1,
                                            expires_at=until)
            return 1
        except IntegrityError:  # another purger created it first: judge its row
            continue
    return None


def _lease_renew(tenant: Tenant | int, token: int) -> bool:
    """The fencing check of one deletion, in the caller's transaction: renew the lease
    held with ``token`` (one conditional ``UPDATE``); false when it is no longer this
    purger's (taken over, or expired), and then the caller writes nothing."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    return CleanupLease.objects.for_tenant(tenant_id).filter(
        pk=tenant_id, token=token, expires_at__gt=NOW).update(
        expires_at=NOW + timedelta(seconds=LEASE_TTL_S)) == 1


def _lease_release(tenant: Tenant | int, token: int) -> None:
    """Give the lease back (expired now) if it is still ``token``'s."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    CleanupLease.objects.for_tenant(tenant_id).filter(pk=tenant_id, token=token).update(
        expires_at=NOW, holder="")


# --------------------------------------------------------------------------------------
# The purge
# --------------------------------------------------------------------------------------

def _ended_before(cutoff) -> Q:
    """Runs whose end (``closed_at``, else ``state_changed_at``) is before ``cutoff``."""
    return (Q(closed_at__isnull=False, closed_at__lt=cutoff)
            | Q(closed_at__isnull=True, state_changed_at__lt=cutoff))


def _ended_at(run: Run):
    return run.closed_at or run.state_changed_at


def _not_held(qs, tenant: Tenant):
    held = held_runs_q(tenant)
    return qs.none() if held is None else qs.exclude(held)


def _payload_due(tenant: Tenant, policy: DataPolicy, now):
    """Phase 1's rule but the holds (a queryset of ``Run``, unlocked): ended runs not yet
    deleted whose end is older than the payload retention at the database time ``now``,
    without an effect in doubt. Empty when the retention is unset."""
    runs = Run.objects.for_tenant(tenant)
    if policy.payload_retention_days is None:
        return runs.none()
    cutoff = now - timedelta(days=policy.payload_retention_days)
    doubtful = Effect.objects.for_tenant(tenant).filter(state__in=EffectState.DOUBTFUL)
    return (runs.filter(_ended_before(cutoff), payloads_deleted_at__isnull=True,
                        recovery_state__in=ENDED)
            .exclude(pk__in=doubtful.values("run_id")))


def _payload_candidates(tenant: Tenant, policy: DataPolicy, now):
    """Phase 1's candidates: ``_payload_due``, not held."""
    return _not_held(_payload_due(tenant, policy, now), tenant)


def expiry_window_s(policy: DataPolicy) -> int | None:
    """How long after its end a deleted run's effect records are kept (seconds): the
    effect retention, and never less than the restart interval; ``None``: forever."""
    if policy.effect_retention_days is None:
        return None
    return max(policy.effect_retention_days * DAY_S, policy.restart_interval_s)


def _expiry_due(tenant: Tenant, policy: DataPolicy, now, *, purging=None):
    """Phase 2's rule but the holds: runs whose payloads are deleted and whose end is
    older than ``expiry_window_s``. Empty when the effect retention is unset.
    ``purging``: phase 1's candidates of the same round, counted as deleted (the dry run:
    a real round's phase 2 runs after its phase 1, and expires what that just purged)."""
    window = expiry_window_s(policy)
    runs = Run.objects.for_tenant(tenant)
    if window is None:
        return runs.none()
    cutoff = now - timedelta(seconds=window)
    deleted = Q(payloads_deleted_at__isnull=False)
    if purging is not None:
        deleted |= Q(pk__in=purging.values("pk"))
    return runs.filter(_ended_before(cutoff), deleted)


def _expiry_candidates(tenant: Tenant, policy: DataPolicy, now, *, purging=None):
    """Phase 2's candidates: ``_expiry_due``, not held."""
    return _not_held(_expiry_due(tenant, policy, now, purging=purging), tenant)


def _kept_by_holds(tenant: Tenant, policy: DataPolicy, now) -> int:
    """How many runs a legal hold keeps from a round at ``now``: runs either phase's rule
    would delete (``_payload_due``, ``_expiry_due``) that an active hold covers (the one
    rule, ``held_runs_q``; a tenant hold covers them all). Two or three queries."""
    due = _payload_due(tenant, policy, now) | _expiry_due(tenant, policy, now)
    held = held_runs_q(tenant)
    return (due if held is None else due.filter(held)).count()


def _purge_one(tenant: Tenant, pk: int, token: int, policy: DataPolicy) -> str:
    """Phase 1 for one run, in its own transaction: ``"purged"``, ``"skipped"`` (the rule,
    judged again under the lock, says no; or another transaction holds the run) or
    ``"fenced"`` (the lease is no longer this purger's: nothing written)."""
    with transaction.atomic():
        run = locks.lock_run_pk(tenant.pk, pk, skip_locked=True)
        if run is None:
            return "skipped"
        if not _lease_renew(tenant, token):
            return "fenced"
        run.tenant = tenant
        now = run.db_now
        days = policy.payload_retention_days
        ended = _ended_at(run)
        if days is None or ended is None or not ended < now - timedelta(days=days):
            return "skipped"
        try:  # the core judges the run's blockers (one rule, one place)
            purge_run_payloads(actor=None, tenant=tenant, run=run, now=now,
                               cause=DeletionCause.RETENTION,
                               policy={"payload_retention_days": days})
        except NotDeletable:
            return "skipped"
    return "purged"


def _expire_one(tenant: Tenant, pk: int, token: int, policy: DataPolicy) -> str:
    """Phase 2 for one run, in its own transaction: ``"expired"``, ``"skipped"`` or
    ``"fenced"`` (as ``_purge_one``). Deletes the run's remaining rows, then the run,
    and writes one ``run.expire`` event with the counts (ids and numbers only)."""
    with transaction.atomic():
        run = locks.lock_run_pk(tenant.pk, pk, skip_locked=True)
        if run is None:
            return "skipped"
        if not _lease_renew(tenant, token):
            return "fenced"
        run.tenant = tenant
        now = run.db_now
        window = expiry_window_s(policy)
        blockers = run_blockers(run, deleted_ok=True)
        if (run.payloads_deleted_at is None or window is None or blockers
                or not _ended_at(run) < now - timedelta(seconds=window)):
            return "skipped"
        t = tenant
        counts = {
            "reconcile_attempts": ReconcileAttempt.objects.for_tenant(t)
            .filter(request__run_id=pk).delete()[0],
            "reconcile_requests": ReconcileRequest.objects.for_tenant(t)
            .filter(run_id=pk).delete()[0],
            "effect_revisions": EffectRevision.objects.for_tenant(t)
            .filter(effect__run_id=pk).delete()[0],
            "effects": Effect.objects.for_tenant(t).filter(run_id=pk).delete()[0],
            "retry_requests": RetryRequest.objects.for_tenant(t).filter(run_id=pk).delete()[0],
            "conflicts": Conflict.objects.for_tenant(t).filter(run_id=pk).delete()[0],
            "transitions": RunTransition.objects.for_tenant(t).filter(run_id=pk).delete()[0],
            "resume_decisions": ResumeDecision.objects.for_tenant(t)
            .filter(run_id=pk).delete()[0],
            "subjects": RunSubject.objects.for_tenant(t).filter(run_id=pk).delete()[0],
        }
        Run.objects.for_tenant(t).filter(pk=pk).delete()
        audit_record(tenant=t, actor=None, action=AuditAction.RUN_EXPIRE,
                     target_type=TargetType.RUN, target_id=run.uuid, run_id=run.uuid,
                     after={"cause": DeletionCause.RETENTION, "counts": counts,
                            "policy": {"effect_retention_days": policy.effect_retention_days,
                                       "restart_interval_s": policy.restart_interval_s}},
                     created_at=now)
    return "expired"


def _phase(tenant, candidates, token, policy, batch_size, stats, done: str) -> bool:
    """Phase ``done`` (``"purged"``: ``_purge_one``; ``"expired"``: ``_expire_one``) over
    ``candidates`` in batches of ``batch_size`` (ascending id, a keyset cursor, so skipped
    runs are not read again); false when fenced."""
    after = 0
    while True:
        batch = list(candidates.filter(pk__gt=after).order_by("pk")
                     .values_list("pk", flat=True)[:batch_size])
        for pk in batch:
            if done == "expired":
                result = _expire_one(tenant, pk, token, policy)
            else:
                result = _purge_one(tenant, pk, token, policy)
            if result == "fenced":
                stats["fenced"] = True
                return False
            stats[done if result != "skipped" else "skipped"] += 1
        stats["batches"] += bool(batch)
        if len(batch) < batch_size:
            return True
        after = batch[-1]


def retention_purge(*, tenant: Tenant, batch_size: int = BATCH_MAX, dry_run: bool = False,
                    holder: str | None = None) -> dict:
    """Apply ``tenant``'s data policy now (module docstring: phase 1 then phase 2).

    ``batch_size``: 1..``BATCH_MAX`` runs read per batch; each run is deleted in its own
    transaction. ``dry_run``: count what the real round would do now (on the database
    clock, with the same selection: ``eligible_expiry`` counts the runs phase 1 would
    purge whose effect window has passed too) and write nothing, not even the lease.
    Returns ``{"tenant", "purged", "expired", "skipped", "batches", "kept_by_hold",
    "fenced", "lease"}`` (``kept_by_hold``: runs a phase would delete but for an active
    legal hold, counted as the round starts, 0 when the lease was held; ``lease``:
    ``"taken"``, ``"held"`` when another purger holds it and nothing was done,
    ``"dry_run"``); with ``dry_run`` also ``"eligible_payloads"`` and
    ``"eligible_expiry"`` (the operator's walk: the dry run under-reported). Safe to run again at any time
    (a killed purge is resumed by the next one once its lease expires), and on many
    workers at once: the lease lets one through per tenant, and the fencing check and
    the rule judged again under each run's lock make every run go exactly once."""
    if type(batch_size) is not int or not 1 <= batch_size <= BATCH_MAX:
        raise InvalidPayload(f"batch_size: must be an integer in 1..{BATCH_MAX}")
    policy = policy_for(tenant)
    stats = {"tenant": tenant.slug, "purged": 0, "expired": 0, "skipped": 0, "batches": 0,
             "kept_by_hold": 0, "fenced": False, "lease": "dry_run" if dry_run else "taken"}
    if dry_run:  # the real round's selection, phase 2 seeing what phase 1 would purge
        now = db_now()
        purging = _payload_candidates(tenant, policy, now)
        stats["eligible_payloads"] = purging.count()
        stats["eligible_expiry"] = _expiry_candidates(tenant, policy, now,
                                                      purging=purging).count()
        stats["kept_by_hold"] = _kept_by_holds(tenant, policy, now)
        return stats
    token = _lease_take(tenant, holder or f"purge-{uuid.uuid4()}")
    if token is None:
        stats["lease"] = "held"
        return stats
    try:
        now = db_now()
        stats["kept_by_hold"] = _kept_by_holds(tenant, policy, now)
        if _phase(tenant, _payload_candidates(tenant, policy, now), token, policy,
                  batch_size, stats, "purged"):
            now = db_now()
            _phase(tenant, _expiry_candidates(tenant, policy, now), token, policy,
                   batch_size, stats, "expired")
    finally:
        if not stats["fenced"]:
            _lease_release(tenant, token)
    return stats


def retention_purge_all(*, batch_size: int = BATCH_MAX, dry_run: bool = False,
                        tenant_slug: str | None = None) -> dict:
    """``retention_purge`` for every tenant that has a data policy (a tenant without one
    keeps everything), or only ``tenant_slug``'s. Returns ``{"tenants": [each tenant's
    counts], "purged", "expired", "failed": [slugs]}`` and, unless ``dry_run`` or
    ``tenant_slug``, records the round's heartbeats (database time). The beat task, the
    in-process worker and ``manage.py purge_expired`` call it."""
    with_policy = DataPolicy.objects.for_all_tenants(
        reason="the scheduled retention purge visits every tenant with a data policy; "
               "each is then purged within its own tenant").values_list("tenant_id", flat=True)
    tenants = Tenant.objects.filter(pk__in=with_policy).order_by("pk")
    if tenant_slug is not None:
        tenants = tenants.filter(slug=tenant_slug)
    out = {"tenants": [], "purged": 0, "expired": 0, "failed": []}
    for tenant in tenants:
        try:
            stats = retention_purge(tenant=tenant, batch_size=batch_size, dry_run=dry_run)
        except Exception:  # noqa: BLE001 - one tenant's failure never stops the others
            log.exception("retention purge of tenant %s failed; the other tenants go on, "
                          "and /readyz names retention until a round succeeds", tenant.slug,
                          extra={"tenant": tenant.slug})
            out["failed"].append(tenant.slug)
            continue
        out["tenants"].append(stats)
        out["purged"] += stats["purged"]
        out["expired"] += stats["expired"]
    if not dry_run and tenant_slug is None:  # a round of one tenant is not a round
        heartbeat.beat(ROUND_HEARTBEAT, *(() if out["failed"] else (HEARTBEAT,)))
    return out


def retention_health() -> str | None:
    """The ``retention`` check of ``/readyz``: ``"not configured"`` while no tenant's
    policy deletes anything; None (ok) when a round finished for every tenant within
    three ``RECOVERY_RETENTION_INTERVAL_S`` (database clock), or when the oldest deleting
    policy is younger than that (its first round may not have come yet). Raises
    ``RetentionLate`` otherwise: the purge fails, or nothing runs it (beat down). Two
    queries."""
    deleting = DataPolicy.objects.for_all_tenants(
        reason="/readyz asks whether any tenant's policy deletes anything").filter(
        Q(payload_retention_days__isnull=False) | Q(effect_retention_days__isnull=False)
        | Q(tombstone_retention_days__isnull=False))
    oldest = deleting.annotate(age=NOW - F("updated_at")).order_by("updated_at").values_list(
        "age", flat=True).first()
    if oldest is None:
        return "not configured"
    bound = 3 * settings.RECOVERY_RETENTION_INTERVAL_S
    found = heartbeat.read().get(HEARTBEAT)
    if found is not None and found.age_s <= bound:
        return None
    if oldest.total_seconds() <= bound:
        return None
    raise RetentionLate("last full round " + (f"{found.age_s:.0f} s ago" if found
                                              else "never"))
