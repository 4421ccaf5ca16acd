"""Domain errors raised by services; the API and views map each to one HTTP answer.

Each carries ``status`` (HTTP code) and ``body()`` (the JSON the contract fixes).
"""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error a service raises on purpose. ``error`` is the stable word.

    A subclass names its HTTP status and its word in its header, the one place each is
    written: ``class NotFound(DomainError, status=404, error="not_found")``; one that
    names neither keeps its base's (``AlreadyDone`` is an ``InvalidTransition``).
    """

    status = 400
    error = "bad_request"

    def __init_subclass__(cls, *, status: int | None = None, error: str | None = None,
                          **kwargs):
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if error is not None:
            cls.error = error

    def __init__(self, detail: str = "", **extra):
        super().__init__(detail or self.error)
        self.detail = detail
        self.extra = extra

    def body(self) -> dict:
        out = {"error": self.error}
        if self.detail:
            out["detail"] = self.detail
        out.update(self.extra)
        return out

    def headers(self) -> dict[str, str]:
        """HTTP headers the answer carries (``NotIntegrated``'s ``Retry-After``); none
        by default."""
        return {}


class InvalidPayload(DomainError, status=400, error="invalid_payload"):
    """Malformed input (CONTRACT.md section 6): 400 naming the field in ``detail``."""


class PayloadTooLarge(DomainError, status=413, error="payload_too_large"):
    """A body over ``RECOVERY_MAX_BODY_BYTES`` (or one Django itself refuses): 413."""


class LengthRequired(DomainError, status=411, error="length_required"):
    """A body sent with ``Transfer-Encoding`` (chunked) instead of ``Content-Length``: 411.
    Django reads such a body as empty under WSGI, so it is refused, never read as ``{}``
    (issue 6, fault 6; ``docs/security/input.md``)."""


class UnsupportedMediaType(DomainError, status=415, error="unsupported_media_type"):
    """A body whose Content-Type is not JSON: 415."""


class PreconditionRequired(DomainError, status=428, error="precondition_required"):
    """A PUT with neither If-Match nor If-None-Match: 428."""


class NotFound(DomainError, status=404, error="not_found"):
    """The object does not exist in this tenant, or the caller may not know it does: 404."""


class Forbidden(DomainError, status=403, error="forbidden"):
    """The caller sees the tenant but its role lacks this right: 403."""


class StaleRevision(DomainError, status=412, error="conflict"):
    """Compare-and-swap refused: 412 ``{"error": "conflict", "current_revision": M}``."""

    def __init__(self, current_revision: int):
        super().__init__("", current_revision=current_revision)
        self.current_revision = current_revision

    def body(self) -> dict:
        return {"error": self.error, "current_revision": self.current_revision}


class ThreadConflict(StaleRevision):
    """A LangGraph put refused (issue 10, docs/langgraph.md): its parent is not the
    head of its thread's namespace, its id is taken by other content, or it would not
    sort after the head. 412 ``{"error": "conflict", "current_revision": M or null,
    "head_checkpoint_id": str or null, "detail": ...}``: M is the namespace envelope's
    revision, the head LangGraph's id of its newest checkpoint (both null when the
    namespace has none). Kept as a conflict of the thread's run when the run exists."""

    def __init__(self, current_revision: int | None, head_checkpoint_id: str | None,
                 detail: str):
        DomainError.__init__(self, detail, current_revision=current_revision,
                             head_checkpoint_id=head_checkpoint_id)
        self.current_revision = current_revision
        self.head_checkpoint_id = head_checkpoint_id

    def body(self) -> dict:
        return {"error": self.error, "current_revision": self.current_revision,
                "head_checkpoint_id": self.head_checkpoint_id, "detail": self.detail}


class Fenced(DomainError, status=409, error="fenced"):
    """A write carried an older (or missing) fencing token while the run is leased: 409."""

    def __init__(self, fencing_token: int, *, run_pk: int | None = None):
        super().__init__("", fencing_token=fencing_token)
        self.run_pk = run_pk

    def body(self) -> dict:
        return {"error": self.error, "fencing_token": self.extra["fencing_token"]}


class LeaseHeld(DomainError, status=409, error="lease_held"):
    """Another owner's lease on the run is live: 409."""


class NoLiveLease(DomainError, status=409, error="no_live_lease"):
    """A reviewer asked to end the run's lease (``services.lease_revoke``) but it holds
    none that is live (never leased, expired, or already ended): 409, nothing to end."""


class OperationExists(DomainError, status=409, error="operation_exists"):
    """Same operation key, same fingerprint, other effect id: 409, continue with that one."""

    def __init__(self, effect_id: str):
        super().__init__("", effect_id=effect_id)

    def body(self) -> dict:
        return {"error": self.error, "effect_id": self.extra["effect_id"]}


class IdempotencyKeyReuse(DomainError, status=422, error="idempotency_key_reuse"):
    """Same operation key, different request fingerprint: 422."""


class UsageDecreased(DomainError, status=422, error="usage_decreased"):
    """A checkpoint write whose usage counter is below the previous revision's
    (CONTRACT.md 8: restored usage never decreases). ``counter`` names it; the refused
    write is kept as a conflict of the run (reason ``usage_decreased``), committed before
    this is raised."""

    def __init__(self, counter: str, previous: int, sent: int):
        super().__init__(f"usage.{counter}: {sent} is below the previous revision's "
                         f"{previous}; usage counters never decrease", counter=counter)


class SecretDetected(DomainError, status=422, error="secret_detected"):
    """A payload or receipt holding a credential-like value, written to a tenant whose
    data policy is ``refuse`` (issue 20, item 7; docs/security/secrets.md): nothing is
    stored. ``paths`` lists ``{"path": JSON pointer, "type": detector word}``, never a
    value; ``detail`` says the first of them in words."""

    def __init__(self, detail: str, paths: list[dict]):
        super().__init__(detail, paths=paths)


class InvalidTransition(DomainError, status=422, error="invalid_transition"):
    """A state move the effect or retry state machine does not allow: 422."""


class PossibleDuplicate(InvalidTransition):
    """An approval asked to accept no possible duplicate (the approver's bulk approve,
    issue 21, item 9) whose retry would send again an effect that may have happened:
    422 ``invalid_transition``; such a request is approved one at a time."""


class ReasonRequired(DomainError, status=400, error="reason_required"):
    """A review action without a reason, or with a blank one: 400 naming ``reason``."""


class OwnerLive(DomainError, status=409, error="owner_live"):
    """Reconciliation refused while the run's owner is alive (CONTRACT.md 3): 409
    ``{"error": "owner_live", "lease_expires_at": ...}``. ``lease_expires_at`` is when the
    owner counts as gone (its lease's expiry, or its last write plus the ambiguity
    threshold), ISO 8601, or null."""

    def __init__(self, detail: str, lease_expires_at: str | None):
        super().__init__(detail, lease_expires_at=lease_expires_at)


class NotIntegrated(DomainError, status=409, error="not_integrated"):
    """An audit event's inclusion proof was asked before the sequencer integrated it into
    the tenant's Merkle tree (issue 22, item 1): 409 ``{"error": "not_integrated"}`` with
    ``Retry-After`` (``RETRY_AFTER_S`` seconds: the sequencer runs every second)."""

    RETRY_AFTER_S = 1

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.RETRY_AFTER_S)}


class TreeIncomplete(DomainError, status=409, error="audit_tree_incomplete"):
    """A leaf or stored node of a tenant's audit Merkle tree that a proof needs is
    missing, or a leaf lies past every signed head: the stored tree was damaged (rows
    deleted?), which ``verify_audit_chain`` reports in full. The proof endpoint answers
    409 ``{"error": "audit_tree_incomplete"}`` instead of a proof it cannot build (an
    attack's finding: it was a 500)."""


class KindVersionInUse(DomainError, status=409, error="kind_version_in_use"):
    """A declared kind version that a checkpoint of the tenant uses cannot change
    (issue 19, item 1): 409; a change of format is a new version."""


class AlreadyDecided(DomainError, status=409, error="already_decided"):
    """A lifecycle decision taken twice (issue 20): approving or rejecting an erasure
    request someone already decided, releasing a legal hold already released: 409, the
    detail naming who decided and when (database clock)."""


class AlreadyDone(InvalidTransition):
    """A review action refused because someone else (or the caller, in another tab) did
    it or its opposite first: 422 ``invalid_transition`` like any refused move, in the same
    API shape (``{"error", "detail"}``; ``detail`` names who and when in words).

    Read inside the refusing service's transaction, so it states what the refusal saw:
    ``what`` is the past participle ("approved", "closed", "acknowledged"...), ``by`` the
    username who did it (``""`` when nobody in particular: the sweep, the runtime),
    ``at`` when (aware ``datetime``, database clock; ``None`` when unknown) and
    ``run_id`` the run's UUID (the dashboard refreshes that run's page). The dashboard
    says it as a sentence: "Already approved by april 2 min ago" (issue 9, item 4).
    """

    def __init__(self, field: str, *, what: str, by: str, at, run_id, detail: str = ""):
        who = f" by {by}" if by else ""
        when = f" at {at.isoformat()}" if at is not None else ""
        super().__init__(f"{field}: {detail or 'already ' + what}{who}{when}")
        self.what, self.by, self.at, self.run_id = what, by, at, run_id


class PurgeRefused(DomainError, status=409, error="purge_refused"):
    """A tombstone purge (or its preparation) refused by the rules of tombstone
    governance (issue 20, item 5; RUNIFOLD.md 5): 409 ``{"error": "purge_refused",
    "detail", "reason"}``, ``reason`` one of ``no_tombstone_retention`` (the policy keeps
    tombstones forever), ``no_export`` (nothing exported yet), ``legal_hold``,
    ``nothing_to_purge``, ``expired`` (past the approval deadline), ``changed`` (the
    frozen tombstones' fingerprint no longer holds), ``state`` (not prepared/approved)."""

    def __init__(self, detail: str, reason: str):
        super().__init__(detail, reason=reason)
class RunDeleted(DomainError, status=409, error="run_deleted"):
    """A write to a run whose payloads retention or erasure deleted (issue 20;
    docs/security/retention.md): 409 ``{"error": "run_deleted", "detail": ...}``. The run
    keeps its tombstone and takes no more checkpoints, effects, leases or resumes; a
    runtime starts a new run."""
