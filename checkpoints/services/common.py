"""Helpers every service shares: the actor's name for audit events, the reason rule
of review actions (CONTRACT.md 3: a reason is required) and the body field checks of
CONTRACT.md 6.

The keyed audit chain itself (``audit_record``, verification, signed head exports) is
``checkpoints.audit`` (docs/security/audit.md); every service calls ``audit_record``
inside its own transaction.
"""

from __future__ import annotations

import re
import uuid

from django.contrib.auth import get_user_model

from ..exceptions import (
    InvalidPayload,
    ReasonRequired,
)
from ..jsonparse import check_name, printable_problem
from ..models import MAX_REVISION

User = get_user_model()

SYSTEM = "system"
U32_MAX = 2**32 - 1
HEX64_RE = re.compile(r"^[0-9a-fA-F]{64}\Z")



def cas_revisions_check(expected_revision: int | None, revision: int) -> None:
    """The compare-and-swap's revision rule for any record (CONTRACT.md 2 and 3): a create
    (``expected_revision=None``, ``If-None-Match: *``) is revision 0; an update from N
    (``If-Match: N``) is revision N+1, and no revision follows ``MAX_REVISION`` (2^63-1).

    Raises ``InvalidPayload`` naming ``revision`` (or ``If-Match``, when the tag is what
    cannot be followed).
    """
    if expected_revision is None and revision != 0:
        raise InvalidPayload("revision: must be 0 when creating (If-None-Match: *)")
    if expected_revision is not None and expected_revision >= MAX_REVISION:
        # No revision can follow 2^63-1 (CONTRACT.md 2): the tag, not the body, is wrong.
        raise InvalidPayload(f"If-Match: revision {MAX_REVISION} is the last one; no "
                             f"revision can follow it")
    if expected_revision is not None and revision != expected_revision + 1:
        raise InvalidPayload(f"revision: must be {expected_revision + 1} (If-Match + 1)")


def _actor_name(actor) -> str:
    return actor.get_username() if actor is not None else SYSTEM


# The keyed chain, its verifier and the signed head exports are ``checkpoints.audit``
# (docs/security/audit.md), imported above; every service here calls ``audit_record``
# inside its own transaction.


def _with_bulk(after: dict, bulk_id: uuid.UUID | None) -> dict:
    """``after`` of a review action's audit event, with ``"bulk_id"`` (the bulk action's
    public id, a string) when the action ran as part of one (``services.bulk``). The
    event's ``after`` is covered by its hash (``audit.audit_fields``), so the id is
    tamper-evident, and events without it hash as before."""
    if bulk_id is not None:
        after["bulk_id"] = str(bulk_id)
    return after


def _require_reason(reason: str | None) -> str:
    if reason is not None and not isinstance(reason, str):
        raise InvalidPayload("reason: must be a string")
    reason = (reason or "").strip()
    if not reason:
        raise ReasonRequired("reason: a reason is required")
    if len(reason) > 4000:
        raise InvalidPayload("reason: at most 4000 characters")
    problem = printable_problem(reason)
    if problem:
        raise InvalidPayload(f"reason: {problem}")
    return reason




def _uuid_field(body: dict, key: str) -> uuid.UUID:
    value = body.get(key)
    if not isinstance(value, str):
        raise InvalidPayload(f"{key}: must be a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidPayload(f"{key}: {value[:64]!r} is not a UUID") from None


def _str_field(body: dict, key: str, max_len: int) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidPayload(f"{key}: must be a non-empty string")
    if len(value) > max_len:
        raise InvalidPayload(f"{key}: at most {max_len} characters")
    return check_name(value, key, blank_words="must be a non-empty string")



# --------------------------------------------------------------------------------------
# Requests that name many runs and carry an idempotency key (bulk actions, migration jobs)
# --------------------------------------------------------------------------------------

def _client_token_check(value) -> uuid.UUID:
    """A submitter's idempotency key (the form's hidden UUID, the API's
    ``Idempotency-Key``): a ``UUID`` or its text. Raises ``InvalidPayload`` naming
    ``client_token``."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str) and len(value) <= 64:
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidPayload("client_token: must be a UUID (the form's hidden field, or the "
                         "Idempotency-Key header)")


def _run_ids_check(values, *, field: str, most: int | None, what: str,
                  empty: str | None) -> list[uuid.UUID]:
    """A request's list of run ids: a list or tuple of UUIDs or UUID strings, duplicates
    dropped, order kept; at most ``most`` (``None``: no bound) of them; empty refused with
    ``empty`` (``None``: allowed). Raises ``InvalidPayload`` naming ``field``; ``what``
    ends the too-many message ("per bulk action")."""
    if not isinstance(values, list | tuple):
        raise InvalidPayload(f"{field}: must be a list of run ids")
    out: dict[uuid.UUID, None] = {}
    for value in values:
        try:
            rid = value if isinstance(value, uuid.UUID) else uuid.UUID(value)
        except (ValueError, TypeError, AttributeError):
            raise InvalidPayload(f"{field}: {str(value)[:64]!r} is not a run id (a UUID)") \
                from None
        out.setdefault(rid)
        if most is not None and len(out) > most:
            raise InvalidPayload(f"{field}: at most {most} runs {what}")
    if not out and empty is not None:
        raise InvalidPayload(f"{field}: {empty}")
    return list(out)


def _resubmitted(model, *, tenant, actor, token: uuid.UUID, fingerprint: str, what: str):
    """The ``model`` row (``BulkAction``, ``MigrationJob``) ``actor`` submitted in
    ``tenant`` with idempotency key ``token``, or ``None``; one with another
    ``fingerprint`` (a different request reusing the key) raises ``InvalidPayload``
    naming ``client_token``, ``what`` saying what differs."""
    found = model.objects.for_tenant(tenant).filter(requested_by=actor,
                                                    client_token=token).first()
    if found is not None and found.fingerprint != fingerprint:
        raise InvalidPayload(f"client_token: already used for a different {what}; send a "
                             "new token")
    return found
