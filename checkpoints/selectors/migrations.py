"""Stored migration jobs (issue 19, item 2; docs/migrations.md): one job with its
per-checkpoint results, and which migrations the Kinds page offers."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db.models import Count

from .. import kinds, roles
from ..exceptions import NotFound
from ..models import MigrationJob, MigrationJobItem, Tenant
from ..permissions import require
from ..vocab import MigrationOutcome
from .common import _uuid_or_404
from .kinds import KindUsage

#: The most items one read of a job returns (the counts cover them all).
JOB_ITEMS_SHOWN = 1000


@dataclass
class MigrationJobResult:
    """A migration job (``job``), its counts per ``MigrationOutcome`` over all its items,
    its first ``JOB_ITEMS_SHOWN`` items in the order they were done (``items``; ``total``
    of them in all), and ``client_token`` for its requester only (else None)."""

    job: MigrationJob
    items: list[MigrationJobItem]
    counts: dict[str, int]
    total: int
    client_token: uuid.UUID | None = None

    @property
    def runs(self) -> list[str] | None:
        """The runs asked for, or None: every run of the kind."""
        return (self.job.selection or {}).get("runs")


def migration_job_get(*, user, tenant: Tenant, kind: str, job_id) -> MigrationJobResult:
    """One migration job of the tenant and kind, with its results: three queries whatever
    its size. Any role of the tenant reads it (``view_runs``: it names runs, checkpoints,
    versions and refusal reasons, never a payload value, like the audit log's
    ``checkpoint.migrate`` events); a malformed or unknown id, another kind's job or
    another tenant's is ``NotFound``."""
    require(user, tenant, roles.VIEW)
    jid = _uuid_or_404(job_id, "migration job")
    if not kinds.is_kind_name(kind):  # no job has it; never sent to the database
        raise NotFound("no such migration job")
    job = MigrationJob.objects.for_tenant(tenant).filter(uuid=jid, kind=kind).first()
    if job is None:
        raise NotFound("no such migration job")
    items = MigrationJobItem.objects.for_tenant(tenant).filter(job=job)
    counts = outcome_counts(tenant, job)
    return MigrationJobResult(job=job, items=list(items.order_by("id")[:JOB_ITEMS_SHOWN]),
                              counts=counts, total=sum(counts.values()),
                              client_token=(job.client_token if job.requested_by_id == user.pk
                                            else None))


def outcome_counts(tenant: Tenant, job: MigrationJob) -> dict[str, int]:
    """``job``'s items per ``MigrationOutcome`` (every outcome, 0 when none), over all its
    attempts: the counts of its page and API (``migration_job_get``) and of its
    ``migration.fail`` event (``services.migration_job_fail``). One query; no rights
    checked (the caller read ``job`` in ``tenant`` with them, or is its worker)."""
    found = dict(MigrationJobItem.objects.for_tenant(tenant).filter(job=job).order_by()
                 .values_list("outcome").annotate(n=Count("id")))
    return {outcome: found.get(outcome, 0) for outcome in MigrationOutcome.values}


def migration_offers(usage: list[KindUsage]) -> dict[str, int]:
    """For the Kinds page and the inbox: kind -> the version a "Migrate to vN" action
    offers (the kind's newest supported version), for each kind with checkpoints of an
    older version a chain of steps leads up from (``KindVersion.migrates_to_newest``:
    the registry's steps or the tenant's declared ones). No query."""
    return {kind.kind: kind.newest_supported_version for kind in usage
            if any(v.checkpoints and v.migrates_to_newest for v in kind.versions)}
