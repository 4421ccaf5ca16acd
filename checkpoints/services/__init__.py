"""Every write to the store, one function per operation (DESIGN.md section 5).

A package by entity, so each write is found by name: ``accounts`` (tenants, accounts,
roles, tokens, reconciler settings), ``runs`` (the run lock, fencing, recovery state,
conflicts, resume decisions), ``leases`` (taken by a runtime, ended by a reviewer),
``checkpoints`` (the compare-and-swap write, reveals, exports), ``effects``, ``review`` (retry, mark unknown, close, acknowledge),
``migrations`` (the operator's migration of a kind's checkpoints to another version),
``kinds`` (a tenant's declared kinds),
``retention`` (the data policy and the scheduled purge; docs/security/retention.md),
``migration_jobs`` (the same as a tenant admin's stored job, its dispatch and re-drive),
``reconcile_requests`` (a reviewer's reconcile, dispatch and re-drive, evidence
reveal), ``sweep``, ``keys`` (key rotation, crypto-shredding), ``bulk`` (one review action on many runs; a big one as a stored
job, ``bulk_jobs`` its dispatch and re-drive) and
``common`` (what they share). Everything public is
re-exported here: callers write ``services.checkpoint_put(...)``. The LangGraph threads
and the runifold files are a layer above, built on these: ``checkpoints.interop``
(services never import it).

Services never import ``checkpoints.jobs.tasks`` nor ``checkpoints.jobs.reconciliation`` (the job
layer above them): reconcile work is handed over by name (``reconcile_requests``), Celery's
task name with a broker and the job's dotted path without one.

Each public function takes keyword arguments ``actor`` (a user, or ``None`` for the
system) and ``tenant``, checks the actor's rights, does its conditional UPDATE, writes
history, the run's recovery state and one audit event in **one** transaction, and queues
Celery work with ``transaction.on_commit``. Views, the API, tasks and commands call these;
nothing else writes the tables.

Lock order, to stay free of deadlocks: the one of ``checkpoints/locks.py``, which takes
every row lock (the tenant's audit chain head, then the run row, then the run's objects
and their conditional UPDATEs).

Transactions: a public service opens ``transaction.atomic()``, not a durable one,
because services compose: the LangGraph thread put writes a checkpoint and its pending
writes in one transaction (``interop.langgraph``), a runifold import commits a whole
file or nothing, and a bulk action runs each run's service inside that run's own block.
What must commit on its own is called only where no transaction is open (a worker, a
command): a reconcile job's claim and each attempt (``jobs.reconciliation``; a claim held
open over the service's look-up would hold the row over a network call), the sweep's
change of one run, one batch of a key rotation. They are not ``durable=True``: the rule
matrices (twin world, isolation table, boundary table) run them inside one rolled-back
transaction per world, which a durable block refuses.

A refused compare-and-swap is not a rollback: the conflict record, the run's conflict
count and its audit event commit, and ``StaleRevision`` is raised after the commit.
"""

# ruff: noqa: F401 - this module is the package's interface: it re-exports every service.

from ..audit import audit_record, registry_verify
from ..audithead import audit_head_check, audit_head_export, audit_head_parse
from ..audittree import audit_health, audit_integrate, audit_integrate_all, audit_verify
from ..exceptions import Forbidden, StaleRevision
from .accounts import (
    TOKEN_TOUCH_INTERVAL,
    account_create,
    account_deactivate,
    account_tenants,
    reconciler_configure,
    role_grant,
    role_revoke,
    tenant_create,
    tenant_set_ambiguity_threshold,
    token_authenticate,
    token_issue,
    tokens_revoke,
)
from .bulk import (
    BulkJobLost,
    bulk_abort,
    bulk_job_act,
    bulk_job_fail,
    bulk_job_finish,
    bulk_search,
    bulk_submit,
)
from .bulk_jobs import bulk_job_dispatch, bulk_jobs_redrive
from .checkpoints import (
    Envelope,
    checkpoint_envelope,
    checkpoint_put,
    parse_envelope,
    payload_reveal,
    receipt_reveal,
    revisions_export,
)
from .common import HEX64_RE, SYSTEM, U32_MAX, _actor_name, _require_reason, _with_bulk
from .counters import counters_compact
from .effects import KEEP_RECEIPT, EffectBody, _effect_transition, effect_put, parse_effect
from .erasure import erasure_approve, erasure_preview, erasure_reject, erasure_request
from .holds import legal_hold_place, legal_hold_release
from .keys import (
    TenantHeld,
    keyring_export,
    keyring_restore,
    payloads_rotate_keys,
    tenant_shred,
)
from .kinds import kind_declare
from .leases import lease_acquire, lease_release, lease_revoke
from .lifecycle import (
    ENDED,
    Blocker,
    Purged,
    active_holds,
    held_runs_q,
    held_tombstones_q,
    pointer_resolve,
    policy_for,
    purge_run_payloads,
    run_blockers,
    runs_blockers,
    subject_digest,
    subject_value,
    subjects_index,
)
from .migration_jobs import (
    MigrationPreview,
    migration_job_dispatch,
    migration_job_fail,
    migration_job_submit,
    migration_jobs_redrive,
    migration_preview,
    migration_runs_check,
)
from .migrations import (
    MigrationItem,
    MigrationReport,
    checkpoints_migrate,
    migration_target_check,
)
from .notify_endpoints import (
    endpoint_create,
    endpoint_delete,
    endpoint_rotate_secret,
    endpoint_update,
    notification_resend,
    notification_test,
)
from .reconcile_requests import evidence_reveal, run_reconcile
from .retention import (
    POLICY_FIELDS,
    data_policy_check,
    data_policy_set,
    retention_health,
    retention_purge,
    retention_purge_all,
    subject_pointer_problem,
)
from .review import (
    _get_run,
    conflicts_acknowledge,
    effect_mark_unknown,
    retry_approve,
    retry_preview,
    retry_reject,
    retry_request,
    retry_withdraw,
    run_close,
)
from .runs import (
    _lock_run,
    require_owner_gone,
    resume_claim,
    resume_preview,
    run_facts,
    run_refresh_state,
)
from .screening import Screened, flag_sentences, screen_effect, screen_payload
from .stored_send import BROKER_DOWN
from .sweep import sweep_stale_runs
from .tombstones import (
    PURGE_DEADLINE,
    audit_export,
    export_watermark,
    purge_fingerprint,
    tombstone_purge_approve,
    tombstone_purge_execute,
    tombstone_purge_prepare,
    tombstone_purge_reject,
)

# The submodules, for tests that read the services' source (the audit, fence and race
# matrices).
MODULES = ("common", "accounts", "runs", "leases", "checkpoints", "effects", "review", "counters",
           "reconcile_requests", "sweep", "keys", "bulk", "bulk_jobs", "migrations", "migration_jobs",
           "kinds", "writepath", "holds", "erasure", "tombstones", "retention",
           "notify_dispatch", "notify_endpoints", "notify_delivery", "notify_render")
#: Submodules whose functions are not services: only the services call them (the
#: checkpoint write's two dialects, below ``checkpoint_put``). The matrices read them to
#: follow the calls, and never count their functions as services.
INTERNAL = ("writepath",)
