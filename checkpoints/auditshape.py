"""What an audit event's ``before`` and ``after`` may hold: one allow-list of top-level
keys per action (issue 20, item 3: "audit events never hold payload values; check it").

An event refers to what it is about by ids, revisions, states and counts, and to the
content it wrote by a hash (``payload_sha256``: SHA-256 hex of the payload's stored JSON
text; ``receipt_sha256`` likewise for a receipt), never by a value taken from a payload,
a receipt, a request or reconcile evidence. So deleting the content (retention, erasure)
leaves every event, and the chain's HMACs, as they were, and an event that names a hash
still proves which content it was about (docs/security/audit.md, "After deletion").

``SHAPES`` maps each action to ``(before keys, after keys)``; ``shape_problem`` says what
an event does wrong. ``ENFORCE`` (off in the service, on in the test suite:
``tests/conftest.py``) makes ``audit.new_event``, which builds every event, raise on a key
not listed, so a test that writes a new key fails until its name is added here, where
``tests/test_audit_shape.py`` refuses names that look like payload values
(``PAYLOAD_WORDS``) and requires an entry for every ``AuditAction``.
"""

from __future__ import annotations

import re

from .vocab import AuditAction as A
from .vocab import BulkOutcome, MigrationOutcome

#: Set by the test suite: ``audit.new_event`` checks every event it builds.
ENFORCE = False

HEX64_RE = re.compile(r"[0-9a-f]{64}\Z")
#: Key names (or parts of names) that would hold content, never allowed in a shape; a
#: ``*_sha256`` key is the one way an event names content.
PAYLOAD_WORDS = ("payload", "receipt", "evidence", "phase_label", "label", "value",
                 "output", "response", "refused_", "transcript", "secret", "subject_value")

_REV = frozenset({"revision"})
_STATE = frozenset({"state"})
_RECOVERY = frozenset({"recovery_state"})
_THREAD = frozenset({"thread_id", "deleted", "run", "strategy", "run_ids", "run_ids_given"})
#: ``flagged_paths``: where screening found a credential-like value (RFC 6901 pointers
#: and the detector's word, never the value); ``large_above``: the size flag's threshold.
_CHECKPOINT_AFTER = frozenset({"revision", "phase_class", "payload_sha256", "reopened",
                               "flagged_paths", "large_above"})
_RETRY_DECIDED = (_STATE, frozenset({"state", "recovery_state", "preview"}))
_CONFLICT = (frozenset({"current_revision"}),
             frozenset({"reason", "expected_revision", "attempted_revision", "fencing_token"}))
_PURGE_RUN = (frozenset(), frozenset({"tombstone", "cause", "policy", "counts"}))
_PURGE_STEP = frozenset({"purge", "state", "tombstones", "first_cursor", "last_cursor",
                         "export_through", "fingerprint", "deadline", "reason"})
_RECONCILER = frozenset({"plugin", "url", "timeout_s", "settle_delay_s"})
_NONE: frozenset[str] = frozenset()
#: A stored job's attempts so far and unexpected failures in a row (``*.fail``).
_ATTEMPTS = frozenset({"attempts", "failures"})
#: A notification endpoint as audited: where by scheme and host (a URL) or domain (an
#: email address) only, never its secret nor a URL's path.
_ENDPOINT = frozenset({"name", "channel", "destination", "event_types", "kinds", "agents",
                       "services", "group_window_s", "quiet_period_s", "enabled"})

#: action -> (keys ``before`` may hold, keys ``after`` may hold). ``bulk_id`` is allowed
#: wherever a review action can run as part of a bulk action (``services._with_bulk``).
SHAPES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    A.TENANT_CREATE: (_NONE, frozenset({"slug", "name"})),
    A.TENANT_THRESHOLD: (frozenset({"ambiguity_threshold_s"}),
                         frozenset({"ambiguity_threshold_s"})),
    A.ROLE_GRANT: (_NONE, frozenset({"role"})),
    A.ROLE_REVOKE: (frozenset({"role"}), frozenset({"roles"})),
    A.TOKEN_ISSUE: (_NONE, frozenset({"prefix", "roles"})),
    A.TOKEN_REVOKE: (_NONE, frozenset({"revoked", "roles"})),
    A.ACCOUNT_DEACTIVATE: (frozenset({"is_active", "roles"}),
                           frozenset({"is_active", "tokens_revoked"})),
    A.RECONCILER_CONFIGURE: (_RECONCILER, _RECONCILER),
    A.CHECKPOINT_WRITE: (_REV, _CHECKPOINT_AFTER),
    A.CHECKPOINT_MIGRATE: (
        frozenset({"revision", "schema_version", "fencing_token"}),
        _CHECKPOINT_AFTER | {"schema_version", "migration", "batch_id", "fencing_token"}),
    A.CHECKPOINT_IMPORT: (_REV, _CHECKPOINT_AFTER),
    A.CHECKPOINT_CONFLICT: _CONFLICT,
    A.EFFECT_WRITE: (_REV, frozenset({"revision", "state", "operation_key", "service",
                                      "receipt_sha256", "reopened", "flagged_paths"})),
    A.EFFECT_IMPORT: (frozenset({"revision", "state"}),
                      frozenset({"revision", "state", "runifold_state", "operation_key",
                                 "service", "receipt_sha256", "reopened"})),
    A.EFFECT_CONFLICT: _CONFLICT,
    A.PAYLOAD_REVEAL: (_NONE, _REV),
    A.PAYLOAD_READ: (_NONE, frozenset({"revision", "graph_checkpoints"})),
    A.PAYLOAD_EXPORT: (_NONE, frozenset({"revisions", "from", "to"})),
    A.PAYLOAD_ROTATE_KEYS: (_NONE, frozenset({"rows", "keys", "from"})),
    A.RECEIPT_REVEAL: (_NONE, _REV),
    A.EVIDENCE_REVEAL: (_NONE, frozenset({"request", "attempt"})),
    A.LEASE_ACQUIRE: (frozenset({"owner", "fencing_token"}),
                      frozenset({"owner", "fencing_token", "expires_at", "reopened"})),
    A.LEASE_REVOKE: (frozenset({"owner", "fencing_token", "expires_at"}),
                     frozenset({"fencing_token", "expires_at", "bulk_id"})),
    A.LEASE_RELEASE: (frozenset({"owner", "fencing_token", "expires_at"}),
                      frozenset({"fencing_token", "expires_at"})),
    A.RETRY_REQUEST: (_RECOVERY, frozenset({"state", "recovery_state", "preview", "bulk_id"})),
    A.RETRY_APPROVE: _RETRY_DECIDED,
    A.RETRY_REJECT: _RETRY_DECIDED,
    A.RETRY_CONSUME: (_STATE, frozenset({"state", "fencing_token", "usage_burnt"})),
    A.RETRY_WITHDRAW: (frozenset({"state", "recovery_state"}),
                       frozenset({"state", "recovery_state"})),
    A.EFFECT_MARK_UNKNOWN: (frozenset({"state", "revision"}),
                            frozenset({"state", "revision", "bulk_id"})),
    A.EFFECT_UNRESOLVED: (_STATE, _STATE),
    A.EFFECT_RECONCILE: (frozenset({"state", "revision"}),
                         frozenset({"state", "revision", "answer", "request", "reconciler"})),
    A.RUN_RECONCILE: (_NONE, frozenset({"task_id", "requests", "effects", "bulk_id"})),
    A.RUN_AMBIGUOUS: (_RECOVERY, _RECOVERY),
    A.RUN_CLOSE: (_RECOVERY, frozenset({"recovery_state", "retry_requests_expired",
                                        "reconcile_requests_cancelled", "bulk_id"})),
    A.CONFLICTS_ACKNOWLEDGE: (frozenset({"recovery_state", "open_conflicts"}),
                              frozenset({"recovery_state", "open_conflicts", "bulk_id"})),
    A.RECONCILE_GAVE_UP: (_NONE, frozenset({"request", "attempts", "failures"})),
    A.RECONCILE_MOVED_ON: (_NONE, frozenset({"request", "state"})),
    A.AUDIT_EXPORT_HEAD: (_NONE, frozenset({"key_id"})),
    A.BULK_SUBMIT: (_NONE, frozenset({"action", "runs", "run_ids", "filters", "job",
                                      "fingerprint", "lease_owner"})),
    A.BULK_FINISH: (_STATE, frozenset({"state", *BulkOutcome.values})),
    A.BULK_ABORT: (_STATE, _STATE),
    A.BULK_FAIL: (_STATE, frozenset({"state", *BulkOutcome.values, "total", *_ATTEMPTS})),
    A.LANGGRAPH_WRITES: (_NONE, frozenset({"checkpoint_id", "task_id", "stored"})),
    A.LANGGRAPH_THREAD_DELETE: (_NONE, _THREAD),
    A.LANGGRAPH_THREAD_COPY: (_NONE, frozenset({"source_thread_id", "target_thread_id",
                                                "source_run_id", "copied", "namespaces"})),
    A.LANGGRAPH_THREAD_PRUNE: (_NONE, _THREAD),
    A.LANGGRAPH_RUNS_DELETE: (_NONE, _THREAD),
    A.RUNIFOLD_EXPORT: (_NONE, frozenset({"checkpoint_lines", "effect_lines", "history"})),
    A.KIND_DECLARE: (frozenset({"kind", "version", "digest"}),
                     frozenset({"kind", "version", "digest", "reversible_from_previous"})),
    A.MIGRATION_SUBMIT: (_NONE, frozenset({"kind", "to_version", "reverse", "runs"})),
    A.MIGRATION_FAIL: (_STATE, frozenset({"state", "kind", "to_version",
                                          *MigrationOutcome.values, *_ATTEMPTS})),
    A.RUN_PURGE: _PURGE_RUN,
    A.RUN_ERASE: _PURGE_RUN,
    A.AUDIT_EXPORT: (frozenset({"through_seq", "through_tombstone", "through_tree_size"}),
                     frozenset({"export", "through_seq", "through_tombstone", "events",
                                "tombstones", "manifest_sha256", "key_id",
                                "watermark_moved", "through_tree_size"})),
    A.TENANT_KEY_DESTROY: (_NONE, frozenset({"key_ids", "legacy_rows", "new_key_id",
                                             "from"})),
    A.LEGAL_HOLD_PLACE: (_NONE, frozenset({"scope", "runs", "subject_field"})),
    A.LEGAL_HOLD_RELEASE: (frozenset({"active", "scope"}), frozenset({"active", "scope"})),
    A.ERASURE_REQUEST: (_NONE, frozenset({"state", "scope", "runs", "subject_field"})),
    A.ERASURE_APPROVE: (_STATE, _STATE),
    A.ERASURE_REJECT: (_STATE, _STATE),
    A.ERASURE_EXECUTE: (_STATE, frozenset({"state", "counts"})),
    A.NOTIFICATION_ENDPOINT_CREATE: (_NONE, _ENDPOINT),
    A.NOTIFICATION_ENDPOINT_UPDATE: (_ENDPOINT, _ENDPOINT),
    A.NOTIFICATION_ENDPOINT_DELETE: (_ENDPOINT, _NONE),
    A.NOTIFICATION_ENDPOINT_ROTATE: (_NONE, frozenset({"previous_valid_until"})),
    A.NOTIFICATION_ENDPOINT_DISABLE: (frozenset({"enabled"}),
                                      frozenset({"enabled", "failed_messages"})),
    A.NOTIFICATION_TEST: (_NONE, frozenset({"event_id"})),
    A.NOTIFICATION_RESEND: (frozenset({"state", "attempts"}), frozenset({"state", "endpoint"})),
    A.TOMBSTONE_PURGE_PREPARE: (_NONE, _PURGE_STEP),
    A.TOMBSTONE_PURGE_APPROVE: (_STATE, _PURGE_STEP),
    A.TOMBSTONE_PURGE_REJECT: (_STATE, _PURGE_STEP),
    A.TOMBSTONE_PURGE_EXECUTE: (_STATE, _PURGE_STEP),
}


def shape_problem(action: str, before: dict | None, after: dict | None) -> str:
    """What is wrong with an event's ``before``/``after`` for ``action``, or "": a key
    its ``SHAPES`` entry does not list, a ``*_sha256`` value that is not 64 lower-case hex
    digits, a ``before``/``after`` that is not an object. An action without an entry is
    not judged here (``tests/test_audit_shape.py`` requires one for every action)."""
    shape = SHAPES.get(action)
    if shape is None:
        return ""
    for side, value, allowed in (("before", before, shape[0]), ("after", after, shape[1])):
        if value is None:
            continue
        if not isinstance(value, dict):
            return f"{action}: {side} must be an object or null"
        extra = sorted(str(k) for k in value if k not in allowed)
        if extra:
            return (f"{action}: {side} holds key(s) {', '.join(extra)} not in "
                    "checkpoints.auditshape.SHAPES (audit events never hold payload values)")
        for key, item in value.items():
            if key.endswith("_sha256") and not (isinstance(item, str)
                                               and HEX64_RE.match(item)):
                return f"{action}: {side}.{key} must be 64 lower-case hex digits"
    return ""


def check(action: str, before: dict | None, after: dict | None) -> None:
    """Raise ``AssertionError`` naming the problem (``shape_problem``) when ``ENFORCE``."""
    if ENFORCE:
        problem = shape_problem(action, before, after)
        assert not problem, problem
