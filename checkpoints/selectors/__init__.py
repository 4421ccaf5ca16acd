"""Reads: every query filters by tenant first, then by the caller's role on the tenant.

Views and the API never call ``Model.objects`` directly. Lists read metadata columns only
(never payload ciphertext), and paginate by keyset on ``(last_write_at, id)`` so a page
costs the same at any depth.

Nothing here grows with the tenant or the run (issue 8): every list is one index scan in
the order of an index (``models.Run.Meta.indexes`` and the others) stopped by its LIMIT,
every count an index-only GROUP BY, and a run's history (checkpoint revisions, effect
revisions) is read one page of ``HISTORY_PAGE`` at a time, newest first, by keyset on the
revision number (``?before=N``). Each function costs a fixed number of queries whatever
the number of rows behind it (``tests/views/test_query_budget.py``).
"""

# ruff: noqa: F401 - the package's interface: callers write ``selectors.run_list(...)``

from .accounts import (
    tenants_for_user,
    tokens_of_account,
)
from .approvals import (
    DEFAULT_RETRY_SORT,
    QUEUE_MAX,
    RETRY_LIST_STATES,
    RETRY_SORTS,
    RETRY_STATE_ALL,
    ApprovalQueue,
    QueueRow,
    approval_queue,
    duplicates_in,
    queue_rows,
    rejected_retries,
    retry_previews,
    retry_request_get,
    retry_request_list,
    retry_requests_in,
)
from .audit import (
    audit_list,
    report,
)
from .common import (
    RUN_LIST_FIELDS,
    _uuid_or_404,
)
from .inbox import (
    _CURSOR_VERSION,
    _NEXT,
    _PREVIOUS,
    DEFAULT_RUN_SORT,
    RUN_SORTS,
    SEARCH_COUNT_CAP,
    RunFilters,
    RunPage,
    StateCounts,
    _counted,
    _filtered_runs,
    _first_page,
    _sort_or_400,
    decode_cursor,
    encode_cursor,
    filter_limit,
    run_ids_matching,
    run_list,
    run_position,
    run_state_counts,
    state_counts,
)
from .kinds import (
    KindUsage,
    KindVersion,
    declared_kind_get,
    kind_known,
    kind_usage,
)
from .lifecycle import (
    ERASURES_SHOWN,
    HOLDS_SHOWN,
    TOMBSTONE_PAGE,
    TombstonePage,
    covering_holds,
    data_policy_get,
    held_q,
    held_runs_q,
    held_tombstones_q,
    hold_covers_q,
    run_legal_holds,
    run_tombstone,
    tombstone_page,
)
from .lifecycle_requests import (
    LIFECYCLE_LIST_MAX,
    erasure_request_get,
    erasure_request_list,
    legal_hold_get,
    legal_hold_list,
)
from .live import (
    MICROS_MAX,
    NEW_RUNS_CAP,
    RunLive,
    RunOutcome,
    bulk_outcomes,
    consistent_read,
    from_micros,
    new_runs,
    run_live,
    to_micros,
)
from .migrations import (
    JOB_ITEMS_SHOWN,
    MigrationJobResult,
    migration_job_get,
    migration_offers,
)
from .nextstep import (
    Step,
    StepInput,
    next_step,
    page_steps,
    run_step,
)
from .notifications import deliveries as notification_deliveries
from .notifications import endpoint_get as notification_endpoint_get
from .notifications import endpoint_list as notification_endpoint_list
from .objects import (
    BULK_LIST_MAX,
    BULK_LIST_PAGE,
    BulkResult,
    bulk_get,
    bulk_list,
    checkpoint_get,
    effect_find,
    effect_get,
    retry_get,
)
from .runs import (
    CONFLICT_PAGE,
    HISTORY_PAGE,
    RUN_PREFIX_MIN,
    RUN_PREFIX_SHOWN,
    HistoryPage,
    OwnerStatus,
    RunDetail,
    RunSummary,
    _attempts_without_evidence,
    _before,
    _history_page,
    _older,
    _run_checkpoints,
    _run_effects,
    checkpoint_history,
    effect_history,
    reconcile_attempt_get,
    reconcile_requests,
    run_detail,
    run_get,
    run_owner_status,
    run_prefix_digits,
    run_prefix_matches,
    run_summary,
    run_thread_id,
)
from .search import (
    _SUBSTRING_TERM,
    _UUID_TEXT,
    SEARCH_COLUMNS,
    SEARCH_MAX,
    SEARCH_SUBSTRING_MIN,
    Contains,
    RunText,
    _search_run_ids,
    search_substring,
    search_terms,
    uuid_prefix_range,
)
from .tombstones import (
    tombstone_list,
    tombstone_purge_get,
    tombstone_purge_list,
)
