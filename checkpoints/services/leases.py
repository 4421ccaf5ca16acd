"""Leases (CONTRACT.md 3): a runtime takes or renews the run's lease
(``lease_acquire``) and gives it back when it is done (``lease_release``); a reviewer
ends a dead owner's live lease (``lease_revoke``). All under the run's lock
(``runs._lock_run``), on the database clock, audited."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import transaction

from .. import intranges, policy, roles
from ..audit import audit_record
from ..exceptions import Forbidden, InvalidPayload, LeaseHeld, NoLiveLease, NotFound
from ..jsonparse import check_name
from ..models import AuditEvent, Run, Tenant
from ..permissions import require
from ..vocab import AuditAction, TargetType
from .common import _require_reason, _with_bulk
from .runs import _lock_run, run_save


def owner_check(owner, field: str = "owner") -> None:
    """A lease owner's rule (CONTRACT.md 3, ``{"owner": str}``): a non-empty string of at
    most ``Run.lease_owner``'s length (256; read from the column, as the API's and the
    bulk bar's fields do: the stop-38 attack found copies of 256) that passes the name
    rule (``check_name``: no control or invisible character, not blank). Raises
    ``InvalidPayload`` naming ``field``. One home for taking a lease and for naming the one
    a reviewer ends (the stop-37 attack: the revoke's owner skipped the name rule and
    echoed a bidi override), one run's or a bulk action's (``services.bulk``,
    ``lease_owner``)."""
    most = Run._meta.get_field("lease_owner").max_length
    words = f"must be a non-empty string of at most {most} characters"
    if not isinstance(owner, str) or not owner or len(owner) > most:
        raise InvalidPayload(f"{field}: {words}")
    check_name(owner, field, blank_words=words)


def lease_acquire(*, actor, tenant: Tenant, run_id: uuid.UUID, owner: str, ttl_s: int) -> Run:
    """Take or renew the run's lease (CONTRACT.md 3).

    A new owner (none before, or the previous lease expired or was ended) bumps the
    fencing token; the same owner renewing keeps it. A lease a reviewer ended
    (``lease_revoke``) is live again: its record (``Run.lease_ended_at``/``_by``/
    ``_reason``) is cleared, so every page and the API say ``live``
    (``policy.lease_state``). Raises ``NotFound`` for an unknown run, ``LeaseHeld``
    (409) while another owner's lease is live, ``InvalidPayload`` for a bad owner or ttl.
    """
    require(actor, tenant, roles.WRITE)
    owner_check(owner)
    intranges.LEASE_TTL_S.check(ttl_s, "ttl_s")
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("no such run")
        now = run.db_now
        live = policy.lease_live(run.lease_owner, run.lease_expires_at, now)
        if live and run.lease_owner != owner:
            raise LeaseHeld(f"owner: the run is leased by another owner until "
                            f"{run.lease_expires_at.isoformat()}")
        before = {"owner": run.lease_owner, "fencing_token": run.fencing_token}
        if not (live and run.lease_owner == owner):
            run.fencing_token += 1
        reopened = run_save(run, now, reopen=True, fencing_token=run.fencing_token,
                            lease_owner=owner, lease_expires_at=now + timedelta(seconds=ttl_s),
                            last_write_at=now, lease_ended_at=None, lease_ended_by=None,
                            lease_ended_reason=None)
        after = {"owner": owner, "fencing_token": run.fencing_token,
                 "expires_at": run.lease_expires_at.isoformat()}
        if reopened:
            after["reopened"] = True
        audit_record(tenant=tenant, actor=actor, action=AuditAction.LEASE_ACQUIRE, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid, before=before, after=after,
                     created_at=run.db_now)
    return run


def lease_revoke(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str,
                 expected_owner: str | None = None, expected_token: int | None = None,
                 bulk_id: uuid.UUID | None = None) -> Run:
    """A reviewer ends the run's live lease, because they know its owner is gone (a
    runtime that took a long lease and died): ``POST …/runs/{id}/lease/revoke``, the run
    page's "End the lease". Reviewer's right, the same as reconcile's (``roles.REVIEW``);
    a reason by the review actions' rule (``_require_reason``).

    Under the run's lock (``_lock_run``), on the database clock: the lease's expiry
    becomes the database time now and the fencing token goes up by one, so from this
    transaction on the old owner's writes are refused (``Fenced``, kept as ``fenced``
    conflicts, CONTRACT.md 3) and reconcile, mark unknown and retry requests are no
    longer refused ``owner_live`` for the lease. ``lease_owner`` is kept, as the record
    of who held it: ``policy.RunFacts.owner_gone_at`` reads a leased run's expiry (now,
    so the owner counts as gone at once), where clearing it would fall back to the quiet
    time after the last write (``last_write_at`` + the tenant's ambiguity threshold) and
    keep a run that wrote recently refused. Who ended it, when (the new expiry) and why
    are kept on the run (``Run.lease_ended_by``, the actor's username;
    ``lease_ended_at``; ``lease_ended_reason``), so the run page, the inbox and the API
    say the lease was ``ended``, not ``expired`` (``policy.lease_state``; the
    newcomer's finding), until a runtime takes it again. ``last_write_at`` is left alone: the runtime wrote nothing. The run's
    recovery state is recomputed (``run_save``; not reopened). A runtime that is in fact
    alive gets a new token only by taking the lease again (``lease_acquire``: an expired
    lease, so the token is bumped once more). One audit event ``lease.revoke``: before
    ``{owner, fencing_token, expires_at}``, after ``{fencing_token, expires_at}``
    (ISO 8601), the reason; ``bulk_id`` in ``after`` when part of a bulk action
    (``services.bulk``'s ``end_lease``, which names the owner: ``expected_owner``).

    ``expected_owner`` (optional): the owner the caller saw (the dashboard form sends the
    one it showed); a live lease held by another (renewed by a new owner since) is
    refused, ``LeaseHeld`` (409 ``lease_held``, naming ``owner``). ``expected_token``
    (optional, the dashboard's): the fencing token the caller saw; a lease taken since,
    even by the same owner, is refused the same way, naming ``fencing_token`` (the
    stop-37 attack: a stale page ended the lease a live runtime had just taken again).
    ``expected_owner`` passes the name rule of ``lease_acquire``'s owner. Raises ``NoLiveLease``
    (409) when the run holds no live lease, ``ReasonRequired``/``InvalidPayload`` (400
    naming ``reason`` or ``owner``), ``NotFound`` (404, also another tenant's run),
    ``Forbidden`` (403 without ``review_runs``), ``RunDeleted`` (409). Returns the run
    (its ``lease_owner``, ``fencing_token``, ``lease_expires_at``).
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    if expected_owner is not None:
        owner_check(expected_owner)
    if expected_token is not None:
        intranges.FENCING_TOKEN.check(expected_token, "fencing_token")
    return _end_live_lease(
        actor=actor, tenant=tenant, run_id=run_id, owner=expected_owner,
        token=expected_token, action=AuditAction.LEASE_REVOKE, reason=reason,
        record=reason, bulk_id=bulk_id, verb="end",
        other_owner=lambda held: (f"owner: the live lease is {held}'s, not "
                                  f"{expected_owner}'s (taken or renewed since); look again"),
        other_token=lambda held: (f"fencing_token: the lease you saw (token {expected_token}) "
                                  f"ended and was taken again since (token {held}); "
                                  "look again"))


#: The record a released lease leaves on the run (``Run.lease_ended_reason``): the page
#: and the API read it as any ended lease, by the writer account that released it.
RELEASED_WORDS = "released by its owner"


def lease_release(*, actor, tenant: Tenant, run_id: uuid.UUID, owner, held_token) -> Run:
    """The runtime holding the run's live lease gives it back (``POST …/runs/{id}/lease/
    release``; a newcomer's finding, stop 39: a worker shutting down cleanly could not, and
    the next worker waited out the lease's ttl; a writer may not revoke). Writer's right,
    as taking the lease (``roles.WRITE``). ``owner`` and ``fencing_token`` are the lease
    it holds (the API's ``owner`` and ``fencing_token``, ``held_token`` here: this is no
    fenced write, ``tests/services/test_fence_matrix.py``), both required: they prove it
    is the holder (``owner_check``'s rule; a token in 0..2^63-1).

    Under the run's lock, on the database clock, as ``lease_revoke``: the expiry becomes
    now and the fencing token goes up by one, so a write still on its way from the
    releasing process is refused (``Fenced``) and the next owner takes the lease at once
    (a new owner bumps the token again, ``lease_acquire``). The owner counts as gone
    from now (``policy.RunFacts.owner_gone_at``): a run released while its checkpoint is
    in flight is ambiguous at once, as it would be after the lease expired. The record
    (``Run.lease_ended_*``: the account, now, ``RELEASED_WORDS``) makes the page, the
    inbox and the API say ``ended``, by whom (``policy.lease_state``). One audit event
    ``lease.release``: before ``{owner, fencing_token, expires_at}``, after
    ``{fencing_token, expires_at}``.

    Raises ``NoLiveLease`` (409) when no lease is live (expired, ended, none taken),
    ``LeaseHeld`` (409 ``lease_held``) when the live lease is another owner's (naming
    ``owner``) or was taken again since (another token, naming ``fencing_token``),
    ``InvalidPayload`` (400 naming ``owner`` or ``fencing_token``), ``NotFound`` (404,
    also another tenant's run), ``Forbidden`` (403: no writer role, or another account
    than the one whose runtime took the lease, ``_taken_by``), ``RunDeleted`` (409).
    Returns the run (its ``lease_owner``, ``fencing_token``, ``lease_expires_at``)."""
    require(actor, tenant, roles.WRITE)
    owner_check(owner)
    intranges.FENCING_TOKEN.check(held_token, "fencing_token")
    return _end_live_lease(
        actor=actor, tenant=tenant, run_id=run_id, owner=owner, token=held_token,
        action=AuditAction.LEASE_RELEASE, reason="", record=RELEASED_WORDS, bulk_id=None,
        verb="release",
        other_owner=lambda held: (f"owner: the live lease is {held}'s, not {owner}'s; only "
                                  "its holder releases it"),
        other_token=lambda held: (f"fencing_token: the live lease holds another token "
                                  f"than {held_token} (taken again since); only its holder "
                                  "releases it"),
        holder=_taken_by)


def _taken_by(run: Run, actor) -> None:
    """Refuse a release by another account than the one whose runtime took the lease
    (the newest ``lease.acquire`` of the run: one indexed read, ``audit_run_idx``): the
    owner name and token are no secret (every role reads them on the run), so a second
    writer of the tenant could otherwise end a live lease, which is a reviewer's
    ``lease_revoke`` (the stop-39 attack). Raises ``Forbidden`` (403)."""
    taker = (AuditEvent.objects.for_tenant(run.tenant_id)
             .filter(run_uuid=run.uuid, action=AuditAction.LEASE_ACQUIRE)
             .order_by("-seq").values_list("actor_id", flat=True).first())
    if taker != actor.pk:
        raise Forbidden("owner: only the account whose runtime took the lease gives it back; "
                        "a reviewer ends another's (POST …/runs/{id}/lease/revoke)")


def _end_live_lease(*, actor, tenant: Tenant, run_id: uuid.UUID, owner: str | None,
                    token: int | None, action: str, reason: str, record: str,
                    bulk_id: uuid.UUID | None, verb: str, other_owner, other_token,
                    holder=None) -> Run:
    """The one way a live lease ends before its time, ``lease_revoke``'s and
    ``lease_release``'s: under the run's lock, on the database clock, a live lease
    (``NoLiveLease`` naming ``verb`` else) held by ``owner`` with ``token`` when given
    (``LeaseHeld`` with ``other_owner(held owner)`` / ``other_token(held token)``'s
    words else), and ``holder(run, actor)`` raising for another account when given,
    ends now: the token one up, the expiry now, the record on the run
    (``Run.lease_ended_*``: the actor's username, now, ``record``), one audit event
    ``action`` (before ``{owner, fencing_token, expires_at}``, after ``{fencing_token,
    expires_at}`` and ``bulk_id`` when given, ``reason``). Returns the run."""
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("no such run")
        now = run.db_now
        if not policy.lease_live(run.lease_owner, run.lease_expires_at, now):
            raise NoLiveLease("run: it holds no live lease (none taken, expired, or already "
                              f"ended); nothing to {verb}")
        if owner is not None and run.lease_owner != owner:
            raise LeaseHeld(other_owner(run.lease_owner))
        if token is not None and run.fencing_token != token:
            raise LeaseHeld(other_token(run.fencing_token))
        if holder is not None:
            holder(run, actor)
        before = {"owner": run.lease_owner, "fencing_token": run.fencing_token,
                  "expires_at": run.lease_expires_at.isoformat()}
        run_save(run, now, fencing_token=run.fencing_token + 1, lease_expires_at=now,
                 lease_ended_at=now, lease_ended_by=actor.get_username(),
                 lease_ended_reason=record)
        audit_record(tenant=tenant, actor=actor, action=action, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid, reason=reason, before=before,
                     after=_with_bulk({"fencing_token": run.fencing_token,
                                       "expires_at": run.lease_expires_at.isoformat()},
                                      bulk_id),
                     created_at=now)
    return run
