"""The service's one vocabulary: every state, class, reason, action and role word, as an
enum, with the named sets the rules use next to it (issue 7, item 3).

The string VALUES are the wire and storage values of CONTRACT.md (section 3: run, effect
and retry states, resume answers; section 4: roles) and DESIGN.md section 4 (recovery
states and their precedence): they are stored in the database, sent in JSON and written
into audit events, so they never change. Python code compares against the members
(``EffectState.SUBMITTED``), never against a literal; a ``TextChoices`` member *is* its
string (``EffectState.SUBMITTED == "submitted"``), so rows, JSON and enums mix freely.

Named sets. An ``Enum`` turns every class-body attribute into a member, so a set cannot
be written inside the class. The sets are assigned right after each class instead
(``EffectState.IN_DOUBT = frozenset({...})``): ``EnumType.__setattr__`` refuses only the
re-assignment of a member, and a later attribute is neither a member nor a choice
(``EffectState.values``/``.choices`` stay the seven states). Sets are ``frozenset`` (for
``in``) or ``tuple`` where the order matters (precedence, tabs); each is defined once,
here, and used by ``policy``, ``services``, ``selectors``, ``reconciliation``, the views,
the API and the templates (``{% vocab %}`` / the ``vocab`` context entry).

This module needs no configured Django (``TextChoices`` only), so ``policy`` stays pure.
The HTTP runtime client (``recovery_client.client``, ``checkpoints.demo``) runs without
Django and keeps the wire strings as literals.
"""

from __future__ import annotations

from django.db.models import TextChoices


class RecoveryState(TextChoices):
    """A run's one recovery state (DESIGN.md 4); materialised on ``Run.recovery_state``.

    Sets: ``PRECEDENCE`` (when several apply, the first wins; ``closed`` comes before
    all, ``healthy``/``completed`` after all), ``INBOX_TABS`` (the dashboard's tabs in the
    order a reviewer works them), ``RETRYABLE`` (a reviewer may request a retry).
    """

    HEALTHY = "healthy"
    AMBIGUOUS = "ambiguous"
    CONFLICTED = "conflicted"
    SCHEMA_MISMATCH = "schema_mismatch"
    AWAITING_APPROVAL = "awaiting_approval"
    RETRY_APPROVED = "retry_approved"
    UNKNOWN_OUTCOME = "unknown_outcome"
    COMPLETED = "completed"
    CLOSED = "closed"


# DESIGN.md section 4: schema_mismatch > unknown_outcome > awaiting_approval >
# retry_approved > ambiguous > conflicted > healthy/completed.
RecoveryState.PRECEDENCE = (
    RecoveryState.SCHEMA_MISMATCH,
    RecoveryState.UNKNOWN_OUTCOME,
    RecoveryState.AWAITING_APPROVAL,
    RecoveryState.RETRY_APPROVED,
    RecoveryState.AMBIGUOUS,
    RecoveryState.CONFLICTED,
)
RecoveryState.INBOX_TABS = (
    RecoveryState.AMBIGUOUS,
    RecoveryState.UNKNOWN_OUTCOME,
    RecoveryState.CONFLICTED,
    RecoveryState.AWAITING_APPROVAL,
    RecoveryState.RETRY_APPROVED,
    RecoveryState.SCHEMA_MISMATCH,
    RecoveryState.HEALTHY,
    RecoveryState.COMPLETED,
    RecoveryState.CLOSED,
)
RecoveryState.RETRYABLE = frozenset({RecoveryState.AMBIGUOUS, RecoveryState.UNKNOWN_OUTCOME})
# A reviewer must look (issue 21: ``run.needs_review``); with the four-eyes states, every
# state a person has to act on: a change into or out of one of these is what the
# notification outbox records (migration 0031's trigger; ``services.notify``).
RecoveryState.NEEDS_REVIEW = frozenset({RecoveryState.AMBIGUOUS, RecoveryState.UNKNOWN_OUTCOME,
                                        RecoveryState.CONFLICTED,
                                        RecoveryState.SCHEMA_MISMATCH})
RecoveryState.NEEDS_PERSON = RecoveryState.NEEDS_REVIEW | {RecoveryState.AWAITING_APPROVAL,
                                                           RecoveryState.RETRY_APPROVED}


class PhaseClass(TextChoices):
    """What the kind registry makes of a payload; ``unsupported`` for unknown kinds or
    versions (CONTRACT.md 3)."""

    STABLE = "stable"
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    UNSUPPORTED = "unsupported"


class EffectState(TextChoices):
    """Effect states (CONTRACT.md section 3, "Effects").

    Sets: ``IN_DOUBT`` (sent, outcome not known yet: reconcile it), ``NEEDS_RETRY``
    (``unknown``/``not_executed``: only a consumed retry moves them back to ``planned``),
    ``DOUBTFUL`` (``IN_DOUBT`` plus ``unknown``: what a run's reason names), ``SETTLED``
    (nothing more is to be learnt: ``planned`` was never sent, the rest are answers),
    ``WITH_RECEIPT`` (a reconciler's receipt is kept: the service's answer).
    """

    PLANNED = "planned"
    SUBMITTED = "submitted"
    CONFIRMED = "confirmed"
    FAILED = "failed"
    UNRESOLVED = "unresolved"
    NOT_EXECUTED = "not_executed"
    UNKNOWN = "unknown"


EffectState.IN_DOUBT = frozenset({EffectState.SUBMITTED, EffectState.UNRESOLVED})
EffectState.NEEDS_RETRY = frozenset({EffectState.UNKNOWN, EffectState.NOT_EXECUTED})
EffectState.DOUBTFUL = EffectState.IN_DOUBT | {EffectState.UNKNOWN}
EffectState.SETTLED = frozenset({EffectState.PLANNED, EffectState.CONFIRMED, EffectState.FAILED,
                                 EffectState.NOT_EXECUTED})
EffectState.WITH_RECEIPT = frozenset({EffectState.CONFIRMED, EffectState.FAILED})


class EffectClass(TextChoices):
    """How safe an effect is to send again (CONTRACT.md 3)."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    NON_IDEMPOTENT = "non_idempotent"


class EffectSource(TextChoices):
    """Who moves an effect (``EffectRevision.source``; the "by" of CONTRACT.md's effect
    table). ``retry`` is the consumed approval re-planning an effect; its revision row
    says ``runtime`` (the runtime's resume did it). ``import`` is a record read from a
    runifold file (``interop.runifold``, issue 10)."""

    RUNTIME = "runtime"
    RECONCILIATION = "reconciliation"
    REVIEWER = "reviewer"
    SWEEP = "sweep"
    RETRY = "retry"
    IMPORT = "import"


class RetryState(TextChoices):
    """requested -> approved | rejected | expired | withdrawn (by its requester, issue 9);
    approved -> consumed (DESIGN.md 4).

    Sets: ``OPEN`` (at most one per run, a database constraint), ``DECIDED``.
    """

    REQUESTED = "requested"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CONSUMED = "consumed"
    WITHDRAWN = "withdrawn"


RetryState.OPEN = frozenset({RetryState.REQUESTED, RetryState.APPROVED})
RetryState.DECIDED = frozenset({RetryState.APPROVED, RetryState.REJECTED})


class RetryOutcome(TextChoices):
    """What an approved retry does to one effect (the retry preview, ``policy.RETRY_OUTCOMES``).

    Sets: ``SENT_AGAIN`` (the effects a consumed retry re-plans: what the approver
    accepted).
    """

    REPLAY_RECEIPT = "replay_receipt"
    STAYS_FAILED = "stays_failed"
    SUBMIT = "submit"
    SUBMIT_AGAIN = "submit_again"
    POSSIBLE_DUPLICATE = "possible_duplicate"
    IN_DOUBT = "in_doubt"
    UNCHANGED = "unchanged"


RetryOutcome.SENT_AGAIN = frozenset({RetryOutcome.SUBMIT_AGAIN, RetryOutcome.POSSIBLE_DUPLICATE})


class ReconcileState(TextChoices):
    """A reconcile request's life: queued -> running -> done, or back to queued (try
    later), or gave_up after the attempt cap (a human decides); cancelled when the run was
    closed or the effect settled before the look-up.

    Sets: ``OPEN`` (at most one per effect, a database constraint).
    """

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    GAVE_UP = "gave_up"
    CANCELLED = "cancelled"


ReconcileState.OPEN = (ReconcileState.QUEUED, ReconcileState.RUNNING)


class ReconcileAnswer(TextChoices):
    """What one look-up answered (``ReconcileAttempt.answer``; ``reconcile.Answer.kind``).

    ``found``/``failed``/``not_executed`` settle the effect, ``cannot_tell`` counts a
    failure, ``no_lookup`` marks it unknown; ``owner_live``/``settling`` mean the service
    was not asked yet; ``moved_on``: the effect had settled by other means.
    Sets: ``SERVICE`` (what a reconciler plugin may answer, in ``reconcile``'s order),
    ``WITH_RECEIPT`` (answers that carry the service's receipt), ``SETTLES`` (a mapping:
    the effect state each service answer settles; ``cannot_tell`` settles nothing).
    """

    FOUND = "found"
    FAILED = "failed"
    NOT_EXECUTED = "not_executed"
    CANNOT_TELL = "cannot_tell"
    NO_LOOKUP = "no_lookup"
    OWNER_LIVE = "owner_live"
    SETTLING = "settling"
    MOVED_ON = "moved_on"


ReconcileAnswer.SERVICE = (ReconcileAnswer.FOUND, ReconcileAnswer.FAILED,
                           ReconcileAnswer.NOT_EXECUTED, ReconcileAnswer.CANNOT_TELL,
                           ReconcileAnswer.NO_LOOKUP)
ReconcileAnswer.WITH_RECEIPT = frozenset({ReconcileAnswer.FOUND, ReconcileAnswer.FAILED})
ReconcileAnswer.SETTLES = {
    ReconcileAnswer.FOUND: EffectState.CONFIRMED,
    ReconcileAnswer.FAILED: EffectState.FAILED,
    ReconcileAnswer.NOT_EXECUTED: EffectState.NOT_EXECUTED,
    ReconcileAnswer.NO_LOOKUP: EffectState.UNKNOWN,
}


class ConflictReason(TextChoices):
    """Why the store refused a write (``Conflict.reason``)."""

    STALE_REVISION = "stale_revision"
    ID_EXISTS = "id_exists"
    FENCED = "fenced"
    USAGE_DECREASED = "usage_decreased"  # a usage counter below the previous revision's


class TargetType(TextChoices):
    """What an audit event (``AuditEvent.target_type``) or a conflict was about.

    Sets: ``WRITABLE`` (what a runtime writes, so what a conflict can be about).
    """

    RUN = "run"
    CHECKPOINT = "checkpoint"
    EFFECT = "effect"
    RETRY_REQUEST = "retry_request"
    TENANT = "tenant"
    ACCOUNT = "account"
    SERVICE = "service"
    BULK_ACTION = "bulk_action"
    KIND = "kind"
    MIGRATION_JOB = "migration_job"
    DATA_POLICY = "data_policy"
    LEGAL_HOLD = "legal_hold"
    ERASURE_REQUEST = "erasure_request"
    TOMBSTONE_PURGE = "tombstone_purge"
    NOTIFICATION_ENDPOINT = "notification_endpoint"
    NOTIFICATION_MESSAGE = "notification_message"


TargetType.WRITABLE = (TargetType.CHECKPOINT, TargetType.EFFECT)


class AuditAction(TextChoices):
    """Every ``AuditEvent.action`` the service writes (docs/security/audit.md).

    ``<target>.conflict`` is ``TargetType`` + ``.conflict`` (``CHECKPOINT_CONFLICT``,
    ``EFFECT_CONFLICT``). Sets: ``REVEALS`` (payload, receipt and evidence reads),
    ``CONFLICT`` (by target type).
    """

    TENANT_CREATE = "tenant.create"
    TENANT_THRESHOLD = "tenant.threshold"
    ROLE_GRANT = "role.grant"
    ROLE_REVOKE = "role.revoke"
    TOKEN_ISSUE = "token.issue"
    TOKEN_REVOKE = "token.revoke"
    ACCOUNT_DEACTIVATE = "account.deactivate"
    RECONCILER_CONFIGURE = "reconciler.configure"
    CHECKPOINT_WRITE = "checkpoint.write"
    CHECKPOINT_CONFLICT = "checkpoint.conflict"
    EFFECT_WRITE = "effect.write"
    EFFECT_CONFLICT = "effect.conflict"
    PAYLOAD_REVEAL = "payload.reveal"
    PAYLOAD_READ = "payload.read"
    PAYLOAD_EXPORT = "payload.export"
    PAYLOAD_ROTATE_KEYS = "payload.rotate_keys"
    RECEIPT_REVEAL = "receipt.reveal"
    EVIDENCE_REVEAL = "evidence.reveal"
    LEASE_ACQUIRE = "lease.acquire"
    # A reviewer ended a live lease whose owner they know is gone (``services.lease_revoke``).
    LEASE_REVOKE = "lease.revoke"
    # The runtime holding a live lease gave it back (``services.lease_release``).
    LEASE_RELEASE = "lease.release"
    RETRY_REQUEST = "retry.request"
    RETRY_APPROVE = "retry.approve"
    RETRY_REJECT = "retry.reject"
    RETRY_CONSUME = "retry.consume"
    RETRY_WITHDRAW = "retry.withdraw"
    EFFECT_MARK_UNKNOWN = "effect.mark_unknown"
    EFFECT_UNRESOLVED = "effect.unresolved"
    EFFECT_RECONCILE = "effect.reconcile"
    RUN_RECONCILE = "run.reconcile"
    RUN_AMBIGUOUS = "run.ambiguous"
    RUN_CLOSE = "run.close"
    CONFLICTS_ACKNOWLEDGE = "conflicts.acknowledge"
    RECONCILE_GAVE_UP = "reconcile.gave_up"
    RECONCILE_MOVED_ON = "reconcile.moved_on"
    AUDIT_EXPORT_HEAD = "audit.export_head"
    BULK_SUBMIT = "bulk.submit"
    BULK_FINISH = "bulk.finish"
    BULK_ABORT = "bulk.abort"
    # A stored job gave up (issue 22 follow-up): ``failed``, by the system, with the
    # stored reason and how far it got; the job's other ends are ``bulk.finish`` and
    # ``bulk.abort`` (a migration job's ``done`` writes no event of its own: its
    # checkpoints are each a ``checkpoint.migrate``).
    BULK_FAIL = "bulk.fail"
    # LangGraph threads (issue 10, docs/langgraph.md): pending writes on a checkpoint that
    # is not its namespace's head (a head's writes are a ``checkpoint.write``), and the
    # saver's deletions and copies, one event per thread changed.
    LANGGRAPH_WRITES = "langgraph.writes"
    LANGGRAPH_THREAD_DELETE = "langgraph.thread_delete"
    LANGGRAPH_THREAD_COPY = "langgraph.thread_copy"
    LANGGRAPH_THREAD_PRUNE = "langgraph.thread_prune"
    LANGGRAPH_RUNS_DELETE = "langgraph.runs_delete"
    CHECKPOINT_IMPORT = "checkpoint.import"
    EFFECT_IMPORT = "effect.import"
    RUNIFOLD_EXPORT = "runifold.export"
    # A checkpoint migrated to another schema version by the operator (issue 19, item 2;
    # docs/migrations.md): its one revision, written instead of a ``checkpoint.write``.
    CHECKPOINT_MIGRATE = "checkpoint.migrate"
    # A tenant's admin declared (or, while no checkpoint used it, replaced) a kind version
    # (issue 19, item 1; docs/kinds.md).
    KIND_DECLARE = "kind.declare"
    # A tenant admin asked for a stored migration job (API or dashboard; its checkpoints
    # are then each a ``checkpoint.migrate`` with the job's id as ``batch_id``).
    MIGRATION_SUBMIT = "migration.submit"
    MIGRATION_FAIL = "migration.fail"
    # Data lifecycle (issue 20; docs/security/retention.md). A tenant admin set the data
    # policy; a run's payloads deleted by retention or erasure (one event per run, with its
    # tombstone's id and counts, never a value); its effect records expired; legal holds
    # placed and released; erasure requests filed, decided, executed; tombstones exported
    # and purged (four eyes); a tenant's data key destroyed (crypto-shredding).
    DATA_POLICY_SET = "data_policy.set"
    RUN_PURGE = "run.purge"
    RUN_ERASE = "run.erase"
    RUN_EXPIRE = "run.expire"
    LEGAL_HOLD_PLACE = "legal_hold.place"
    LEGAL_HOLD_RELEASE = "legal_hold.release"
    ERASURE_REQUEST = "erasure.request"
    ERASURE_APPROVE = "erasure.approve"
    ERASURE_REJECT = "erasure.reject"
    ERASURE_EXECUTE = "erasure.execute"
    AUDIT_EXPORT = "audit.export"
    TOMBSTONE_PURGE_PREPARE = "tombstone_purge.prepare"
    TOMBSTONE_PURGE_APPROVE = "tombstone_purge.approve"
    TOMBSTONE_PURGE_REJECT = "tombstone_purge.reject"
    TOMBSTONE_PURGE_EXECUTE = "tombstone_purge.execute"
    TENANT_KEY_DESTROY = "tenant.key_destroy"
    NOTIFICATION_ENDPOINT_CREATE = "notification_endpoint.create"
    NOTIFICATION_ENDPOINT_UPDATE = "notification_endpoint.update"
    NOTIFICATION_ENDPOINT_DELETE = "notification_endpoint.delete"
    NOTIFICATION_ENDPOINT_ROTATE = "notification_endpoint.rotate_secret"
    NOTIFICATION_ENDPOINT_DISABLE = "notification_endpoint.disable"
    NOTIFICATION_TEST = "notification.test"
    NOTIFICATION_RESEND = "notification.resend"


AuditAction.REVEALS = frozenset({AuditAction.PAYLOAD_REVEAL, AuditAction.PAYLOAD_READ,
                                 AuditAction.PAYLOAD_EXPORT, AuditAction.RECEIPT_REVEAL,
                                 AuditAction.EVIDENCE_REVEAL, AuditAction.RUNIFOLD_EXPORT})
AuditAction.CONFLICT = {TargetType.CHECKPOINT: AuditAction.CHECKPOINT_CONFLICT,
                        TargetType.EFFECT: AuditAction.EFFECT_CONFLICT}


class SecretsPolicy(TextChoices):
    """What a credential found in a payload or receipt does (issue 20, item 7): ``warn``
    (stored; the run page and the report flag the field path, never the value) or
    ``refuse`` (422 naming the path; nothing stored)."""

    WARN = "warn"
    REFUSE = "refuse"


class HoldScope(TextChoices):
    """What a legal hold covers: the runs it names, every run of a subject, the tenant."""

    RUNS = "runs"
    SUBJECT = "subject"
    TENANT = "tenant"


class ErasureState(TextChoices):
    """An erasure request: ``requested`` -> ``approved`` (by an approver, never the
    requester) -> ``executed``; or ``requested`` -> ``rejected``."""

    REQUESTED = "requested"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXECUTED = "executed"


class ErasureOutcome(TextChoices):
    """What an executed erasure request did, from its ``counts``
    (``ErasureRequest.outcome``; the API's ``outcome``): the state stays ``executed``
    whatever was erased, so a request a legal hold blocked entirely says
    ``nothing_erased`` here (the recon newcomer's finding: "executed" with 0 erased)."""

    ERASED = "erased", "every covered run erased"
    PARTLY_ERASED = "partly_erased", "some runs erased, the rest blocked"
    NOTHING_ERASED = "nothing_erased", "nothing erased: every covered run was blocked"
    MATCHED_NOTHING = "matched_nothing", "it matched no run: nothing to erase"


class PurgeState(TextChoices):
    """A tombstone purge: ``prepared`` -> ``approved`` (not by the preparer, before the
    deadline) -> ``executed``; or ``prepared`` -> ``rejected``."""

    PREPARED = "prepared"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXECUTED = "executed"


class DeletionCause(TextChoices):
    """Why a run's payloads were deleted: the tenant's ``retention`` or an ``erasure``
    request."""

    RETENTION = "retention"
    ERASURE = "erasure"


class LeaseState(TextChoices):
    """What a run's lease is now, as every page and the API say it
    (``policy.lease_state``, the one rule; ``RunSerializer.lease_state``): ``live`` (its
    owner holds it), ``expired`` (it timed out: the owner stopped renewing) or ``ended``
    (a reviewer ended it, ``services.lease_revoke``: who, when and why are on the run).
    A run with no lease owner has none of these."""

    LIVE = "live"
    EXPIRED = "expired"
    ENDED = "ended"


class BulkActionKind(TextChoices):
    """What a bulk action does to each selected run (issue 9, item 3): each is the
    single action of the run page, called once per run (``services.bulk``).

    ``mark_unknown`` marks every in-doubt (``EffectState.IN_DOUBT``) effect of the run.
    ``end_lease`` ends the run's live lease held by the owner the request names (its
    ``lease_owner``: the runtime that is gone; ``services.lease_revoke``).
    Sets: ``CONFIRM`` (cannot be undone by a reviewer: the form asks for a ticked box).
    """

    RECONCILE = "reconcile", "reconcile"
    MARK_UNKNOWN = "mark_unknown", "mark unknown"
    REQUEST_RETRY = "request_retry", "request retry"
    CLOSE = "close", "close"
    ACKNOWLEDGE_CONFLICTS = "acknowledge_conflicts", "acknowledge conflicts"
    END_LEASE = "end_lease", "end the lease"


BulkActionKind.CONFIRM = frozenset({BulkActionKind.MARK_UNKNOWN, BulkActionKind.CLOSE})


class BulkState(TextChoices):
    """A bulk action's progress: ``running`` from its record until every run has its
    result, then ``finished``. A bulk action run as a stored job (more than
    ``BULK_MAX_RUNS`` runs; issue 22, item 6) is ``queued`` until a worker claims it,
    ``running`` while one holds its claim, and ends ``finished``, ``aborted`` (a reviewer
    stopped it: the runs done stay done) or ``failed`` (gave up: ``last_error`` says
    why)."""

    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


BulkState.OPEN = frozenset({BulkState.QUEUED, BulkState.RUNNING})


class BulkOutcome(TextChoices):
    """One run's result in a bulk action: ``done`` (the action committed, audited with
    the bulk id), ``refused`` (the action's own rule refused it: nothing of it was
    written; the detail says why), ``failed`` (an unexpected error: rolled back, logged)."""

    DONE = "done"
    REFUSED = "refused"
    FAILED = "failed"


class ResumeAction(TextChoices):
    """The ``action`` of a resume answer (CONTRACT.md 3, ``GET …/runs/{run_id}/resume``)."""

    REPLAY = "replay"
    CONTINUE = "continue"
    REJECT = "reject"
    RETRY = "retry"
    RECONCILE = "reconcile"


class ResumeReason(TextChoices):
    """The ``reason`` of a resume answer (CONTRACT.md 3): one stable snake_case word."""

    NO_CHECKPOINT = "no_checkpoint"
    UNSUPPORTED_SCHEMA = "unsupported_schema"
    IDENTITY_MISMATCH = "identity_mismatch"
    COMPLETED = "completed"
    CLOSED = "closed"
    EFFECTS_IN_DOUBT = "effects_in_doubt"
    RETRY_APPROVED = "retry_approved"
    AWAITING_APPROVAL = "awaiting_approval"
    OUTCOME_UNKNOWN = "outcome_unknown"
    IN_FLIGHT = "in_flight"
    STABLE = "stable"
    USAGE_MISMATCH = "usage_mismatch"  # the runtime's usage is not what the checkpoint allows
    # The latest checkpoint is an older version of a kind that migrates offline
    # (``MigrationMode.OFFLINE``): the operator migrates it first (CONTRACT.md 8).
    MIGRATION_REQUIRED = "migration_required"


class MigrationMode(TextChoices):
    """How a kind takes a new schema version (issue 19, item 2; docs/migrations.md).
    ``lazy`` (the default): older versions stay readable and resumable, and the operator
    migrates them when it suits; ``offline``: a run whose latest checkpoint is an older
    version is not resumed (``ResumeReason.MIGRATION_REQUIRED``) until it is migrated."""

    LAZY = "lazy"
    OFFLINE = "offline"


class MigrationOutcome(TextChoices):
    """One checkpoint's result in a migration (``services.migrations``): ``migrated`` (one
    new revision at the target version, committed with its audit event), ``skipped``
    (already at the target version, or gone), ``refused`` (a ``MigrationRefusal`` says
    why; nothing written), ``conflict`` (a runtime's write won the compare-and-swap; the
    refused migration is kept as a conflict, like any refused write)."""

    MIGRATED = "migrated"
    SKIPPED = "skipped"
    REFUSED = "refused"
    CONFLICT = "conflict"


class MigrationJobState(TextChoices):
    """A stored migration job's progress (``MigrationJob``; docs/migrations.md):
    ``queued`` (waiting for a worker, or for its next attempt after a failure),
    ``running`` (claimed by a worker until ``claimed_until``), ``done`` (the walk ended:
    every checkpoint has its item), ``failed`` (gave up: ``last_error`` says why)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


MigrationJobState.OPEN = frozenset({MigrationJobState.QUEUED, MigrationJobState.RUNNING})


class MigrationRefusal(TextChoices):
    """Why a checkpoint was not migrated: its run's owner is live (``owner_live``, the
    reconciliation's rule), no chain of registered migrations leads to the target version
    (``no_path``), a step back has no inverse or refuses this payload
    (``not_reversible``), or the result does not match the target schema
    (``invalid_after``)."""

    OWNER_LIVE = "owner_live"
    NO_PATH = "no_path"
    NOT_REVERSIBLE = "not_reversible"
    INVALID_AFTER = "invalid_after"


class Role(TextChoices):
    """Tenant roles (CONTRACT.md 4); ``roles.ROLE_PERMISSIONS`` maps each to its rights."""

    VIEWER = "viewer"
    REVIEWER = "reviewer"
    APPROVER = "approver"
    WRITER = "writer"
    ADMIN = "admin"


# --- How the dashboard shows these words ----------------------------------------------
# Here, below every surface, because the dashboard's filters, the reports' charts
# (``reports/charts.py``) and the CSS (``static/css/app.css``) must agree on them.

_R, _E, _T, _Q, _A, _P = (RecoveryState, EffectState, RetryState, ReconcileState,
                          ReconcileAnswer, PhaseClass)
#: CSS modifier per state word; states of runs, effects and retry requests share colours
#: (a word in two enums, e.g. ``failed``, has one colour).
BADGE_CLASSES = {
    _R.AMBIGUOUS: "amber", _R.CONFLICTED: "orange", _R.SCHEMA_MISMATCH: "purple",
    _R.UNKNOWN_OUTCOME: "red", _R.AWAITING_APPROVAL: "blue", _R.RETRY_APPROVED: "teal",
    _R.HEALTHY: "green", _R.COMPLETED: "grey", _R.CLOSED: "grey",
    _E.PLANNED: "grey", _E.SUBMITTED: "amber", _E.UNRESOLVED: "amber", _E.CONFIRMED: "green",
    _E.FAILED: "red", _E.NOT_EXECUTED: "teal", _E.UNKNOWN: "red",
    _T.REQUESTED: "blue", _T.APPROVED: "teal", _T.REJECTED: "grey", _T.EXPIRED: "grey",
    _T.CONSUMED: "green",
    # reconcile requests and what their look-ups answered
    _Q.QUEUED: "blue", _Q.RUNNING: "amber", _Q.DONE: "green", _Q.GAVE_UP: "red",
    _Q.CANCELLED: "grey", _A.FOUND: "green", _A.CANNOT_TELL: "orange", _A.NO_LOOKUP: "red",
    _A.OWNER_LIVE: "amber", _A.SETTLING: "amber", _A.MOVED_ON: "grey",
    _P.STABLE: "green", _P.IN_FLIGHT: "amber", _P.UNSUPPORTED: "purple",
    # bulk actions: a run's outcome (done/failed share the words above), the bulk's state
    BulkOutcome.REFUSED: "orange", BulkState.FINISHED: "green", BulkState.ABORTED: "grey",
    # a checkpoint's result in a migration (refused: as above; a job's state: as reconcile)
    MigrationOutcome.MIGRATED: "green", MigrationOutcome.SKIPPED: "grey",
    MigrationOutcome.CONFLICT: "orange",
    # a runtime that restored usage lower than it had spent: not a race, a fault
    ConflictReason.USAGE_DECREASED: "red",
}


def words(word) -> str:
    """A state word for people: ``"unknown_outcome"`` -> ``"unknown outcome"``; ``""`` for
    None."""
    return str(word or "").replace("_", " ")


class NotificationChannel(TextChoices):
    """Where a notification endpoint sends (issue 21, item 1): a signed webhook (Standard
    Webhooks), an email address (Django's mail backend), or a Slack- or Teams-compatible
    incoming-webhook URL (a JSON ``{"text": ...}`` body, unsigned: those services
    authenticate by the URL's secret path)."""

    WEBHOOK = "webhook"
    EMAIL = "email"
    SLACK = "slack"
    TEAMS = "teams"


NotificationChannel.URL = frozenset({NotificationChannel.WEBHOOK, NotificationChannel.SLACK,
                                     NotificationChannel.TEAMS})


class NotificationEventType(TextChoices):
    """A typed notification event (issue 21, item 2; docs/notifications.md). Each carries
    the tenant, the run(s), state, reason and links; never a payload value or a receipt.

    Sets: ``SUBSCRIBABLE`` (what an endpoint may choose; ``test`` is only sent by "send
    test event"), ``GROUPED`` (events of runs that went into the same state within the
    endpoint's window and share a cause become one message per incident)."""

    RUN_NEEDS_REVIEW = "run.needs_review"
    RETRY_AWAITING_APPROVAL = "retry.awaiting_approval"
    RETRY_DECIDED = "retry.decided"
    RECONCILE_GAVE_UP = "reconcile.gave_up"
    OUTCOME_UNKNOWN_AGING = "outcome.unknown_aging"
    RUN_RESOLVED = "run.resolved"
    DIGEST = "digest"
    TEST = "test"


NotificationEventType.SUBSCRIBABLE = tuple(
    t for t in NotificationEventType if t != NotificationEventType.TEST)
NotificationEventType.GROUPED = frozenset({
    NotificationEventType.RUN_NEEDS_REVIEW, NotificationEventType.RETRY_AWAITING_APPROVAL,
    NotificationEventType.RECONCILE_GAVE_UP, NotificationEventType.OUTCOME_UNKNOWN_AGING})


class DeliveryState(TextChoices):
    """A notification message's delivery (issue 21, items 4-5): ``pending`` (due at
    ``next_attempt_at``; retried on the fixed schedule), ``delivered`` (a 2xx within the
    timeout), ``failed`` (the schedule ran out, or the endpoint was disabled or deleted
    while it waited)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
