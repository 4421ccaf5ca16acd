"""How ``generate_load`` writes (issue 8): one plan per run, rows built for every table in
the order of their foreign keys and inserted in batches, with a progress bar.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
import uuid
from datetime import datetime, timedelta

from django.core.management.base import CommandError
from django.db import connection, transaction
from tqdm import tqdm

from checkpoints import crypto, policy
from checkpoints.dbclock import db_now
from checkpoints.jsonparse import dumps
from checkpoints.models import (
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    RetryRequest,
    Run,
)
from checkpoints.vocab import (
    ConflictReason,
    EffectSource,
    EffectState,
    PhaseClass,
    RecoveryState,
    RetryState,
    TargetType,
)

from .loaddata import (
    EFFECT_PATHS,
    SERVICES,
    STATE_WEIGHTS,
    Template,
    _Effect,
    _RunPlan,
    _templates,
    _Tenant,
)

_REQUIRED = object()


class _Table:
    """Rows of one model in column order, with the model's defaults filled in, written in
    one go by ``flush`` (COPY on PostgreSQL, batched INSERTs elsewhere). Ids are handed out
    by ``ids`` before the rows are built, so related rows can name them."""

    def __init__(self, model, now: datetime):
        self.model = model
        self.fields = list(model._meta.concrete_fields)
        self.columns = [f.column for f in self.fields]
        self.defaults = []
        for f in self.fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                self.defaults.append(now)
            elif f.has_default():
                self.defaults.append(f.get_default())
            elif f.null or f.primary_key:
                self.defaults.append(None)
            elif f.blank and f.empty_strings_allowed:
                self.defaults.append("")
            else:
                self.defaults.append(_REQUIRED)
        self.index = {f.attname: i for i, f in enumerate(self.fields)}
        self.rows: list[list] = []
        self._next_id: int | None = None

    def ids(self, n: int) -> list[int]:
        """``n`` fresh primary keys (the table's identity sequence on PostgreSQL; after
        the largest id elsewhere: the command is the only writer of a load database)."""
        if n <= 0:
            return []
        table = self.model._meta.db_table
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                cur.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id')) "
                            "FROM generate_series(1, %s)", [table, n])
                return [r[0] for r in cur.fetchall()]
            if self._next_id is None:
                cur.execute(f'SELECT COALESCE(MAX("id"), 0) FROM "{table}"')  # noqa: S608
                self._next_id = cur.fetchone()[0] + 1
        start, self._next_id = self._next_id, self._next_id + n
        return list(range(start, start + n))

    def add(self, **values) -> None:
        row = list(self.defaults)
        for name, value in values.items():
            row[self.index[name]] = value
        self.rows.append(row)

    def flush(self) -> int:
        rows, self.rows = self.rows, []
        if not rows:
            return 0
        for row in rows:
            for i, value in enumerate(row):
                if value is _REQUIRED:
                    raise CommandError(f"generate_load: {self.model.__name__}."
                                       f"{self.fields[i].attname} left empty")
        fields, columns = self.fields, self.columns
        pk = self.index[self.model._meta.pk.attname]
        if rows[0][pk] is None:  # no ids handed out: the database numbers the rows
            fields, columns = fields[:pk] + fields[pk + 1:], columns[:pk] + columns[pk + 1:]
            rows = [row[:pk] + row[pk + 1:] for row in rows]
        table = connection.ops.quote_name(self.model._meta.db_table)
        cols = ", ".join(connection.ops.quote_name(c) for c in columns)
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                json_at = [i for i, f in enumerate(fields)
                           if f.get_internal_type() == "JSONField"]
                for row in rows:
                    for i in json_at:
                        if row[i] is not None:
                            row[i] = json.dumps(row[i])
                with cur.cursor.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                prepared = [[f.get_db_prep_save(v, connection)
                             for f, v in zip(fields, row, strict=True)] for row in rows]
                marks = ", ".join(["%s"] * len(columns))
                per = max(1, 900 // len(columns))  # SQLite's bound-parameter limit
                for i in range(0, len(prepared), per):
                    chunk = prepared[i:i + per]
                    values = ", ".join([f"({marks})"] * len(chunk))
                    cur.execute(f"INSERT INTO {table} ({cols}) VALUES {values}",  # noqa: S608
                                [v for row in chunk for v in row])
        return len(rows)


class _Progress:
    """A tqdm progress bar on stderr (tqdm is a dependency: import_runifold's bar too)."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.total, self.done, self.desc, self.enabled = total, 0, desc, enabled
        self.bar = None
        self.started = time.monotonic()
        if not enabled:
            return
        self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr)

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        width = 30
        filled = int(width * self.done / max(1, self.total))
        rate = self.done / max(1e-9, time.monotonic() - self.started)
        sys.stderr.write(f"\r{self.desc} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{self.done}/{self.total} runs ({rate:,.0f}/s)")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


class _Generator:
    """Builds the rows of one batch of runs and writes them in one transaction."""

    def __init__(self, rng: random.Random, tenants: list[_Tenant], big_share: float):
        self.rng = rng
        self.tenants = tenants
        n = len(tenants)
        self.weights = [1.0] if n == 1 else [big_share] + [(1 - big_share) / (n - 1)] * (n - 1)
        self.now = db_now()
        self.templates = _templates()
        self.history: dict[tuple[str, int], list[Template]] = {}  # earlier revisions
        for c in (PhaseClass.STABLE, PhaseClass.IN_FLIGHT):
            for x in self.templates[c]:
                self.history.setdefault((x.kind, x.schema_version), []).append(x)
        # Shared by every tenant's rows: the legacy master-key form (loaddata._template).
        self.receipt = crypto.encrypt_text(dumps({"id": "ch_3PqL2x", "status": "succeeded",
                                                  "amount": 2599}), tenant=None)
        self.failure = crypto.encrypt_text(dumps({"error": "card_declined"}), tenant=None)
        self.tables = {m: _Table(m, self.now) for m in (Run, Checkpoint, CheckpointRevision,
                                                         RetryRequest, Effect, EffectRevision,
                                                         Conflict)}
        self.counts = {name: 0 for name in ("runs", "checkpoint revisions", "effects",
                                            "effect revisions", "conflicts", "retry requests")}
        self.threshold = {t.tenant.pk: t.tenant.ambiguity_threshold_s for t in tenants}

    # -- planning ------------------------------------------------------------------------

    def _ago(self, low_s: float, high_s: float) -> datetime:
        """A time between ``high_s`` and ``low_s`` seconds ago, most of them recent."""
        span = high_s - low_s
        return self.now - timedelta(seconds=low_s + min(span, self.rng.expovariate(4 / span)))

    def _effects(self, states: list[str], start: datetime, run_uuid: uuid.UUID) -> list[_Effect]:
        out = []
        for i, state in enumerate(states):
            service, effect_class = self.rng.choice(SERVICES)
            out.append(_Effect(uuid.uuid4(), service, effect_class,
                               f"{service}:{run_uuid.hex[:16]}:{i}", state,
                               start + timedelta(seconds=i + 1)))
        return out

    def plan(self, state: str, tenant: _Tenant) -> tuple[_RunPlan, list[str]]:
        """A run that ``policy.recovery_state`` puts in ``state``, and its effects' states."""
        rng = self.rng
        threshold = self.threshold[tenant.tenant.pk]
        gone = self._ago(threshold + 120, 30 * 86400)  # quiet for longer than the threshold
        recent = self._ago(1, max(2, threshold - 60))
        pick = {c: rng.choice(self.templates[c]) for c in PhaseClass.values}
        done = [EffectState.CONFIRMED] * rng.randint(0, 2)
        if state == RecoveryState.HEALTHY:
            if rng.random() < 0.2:  # in progress: a live lease
                p = _RunPlan(state, pick[PhaseClass.IN_FLIGHT], recent, recent,
                             lease_owner=f"worker-{rng.randint(1, 64)}",
                             lease_expires_at=self.now + timedelta(hours=1), fencing_token=1)
                eff = done + [EffectState.SUBMITTED]
            else:
                p = _RunPlan(state, pick[PhaseClass.STABLE], gone, gone)
                eff = done + [EffectState.PLANNED] * rng.randint(0, 1)
        elif state == RecoveryState.COMPLETED:
            p = _RunPlan(state, pick[PhaseClass.COMPLETED], gone, gone)
            eff = done + [EffectState.CONFIRMED] + [EffectState.FAILED] * (rng.random() < .1)
        elif state == RecoveryState.SCHEMA_MISMATCH:
            p = _RunPlan(state, pick[PhaseClass.UNSUPPORTED], gone, gone)
            eff = done
        elif state == RecoveryState.CONFLICTED:
            p = _RunPlan(state, pick[PhaseClass.STABLE], gone, gone,
                         conflicts=rng.randint(1, 3))
            eff = done
        else:  # the in-flight, owner-gone family
            p = _RunPlan(state, pick[PhaseClass.IN_FLIGHT], gone, gone)
            if rng.random() < 0.3:  # an expired lease rather than none
                p.lease_owner = f"worker-{rng.randint(1, 64)}"
                p.lease_expires_at = gone + timedelta(seconds=30)
                p.fencing_token = rng.randint(1, 3)
            if state == RecoveryState.AMBIGUOUS:
                eff = done + rng.choice(([EffectState.UNRESOLVED], [EffectState.SUBMITTED], []))
            elif state == RecoveryState.CLOSED:
                eff = done + rng.choice(([EffectState.UNRESOLVED], [EffectState.UNKNOWN], []))
                p.closed = True
            else:  # unknown outcome, and the retry states that come from it
                eff = done + [EffectState.UNKNOWN]
                p.retry_state = {RecoveryState.AWAITING_APPROVAL: RetryState.REQUESTED,
                                 RecoveryState.RETRY_APPROVED: RetryState.APPROVED}.get(state, "")
        p.created_at = p.last_write_at - timedelta(seconds=rng.randint(5, 3600))
        return p, eff

    # -- writing -------------------------------------------------------------------------

    def batch(self, n: int, revisions: int) -> None:
        states = self.rng.choices(list(STATE_WEIGHTS), weights=list(STATE_WEIGHTS.values()), k=n)
        if n >= len(STATE_WEIGHTS):  # every recovery state in every batch that can hold them
            states[:len(STATE_WEIGHTS)] = list(STATE_WEIGHTS)
        owners = self.rng.choices(self.tenants, weights=self.weights, k=n)
        per_run = [1] * n
        for i in self.rng.choices(range(n), k=max(0, revisions - n)):
            per_run[i] += 1
        plans = []
        for state, tenant, k in zip(states, owners, per_run, strict=True):
            plan, effect_states = self.plan(state, tenant)
            plans.append((tenant, uuid.uuid4(), plan, effect_states, k))
        self._write(plans)

    def long_run(self, run_uuid: uuid.UUID, revisions: int) -> None:
        """One agent run of ``revisions`` revisions in the first tenant: ambiguous (its
        worker died in a turn, an effect unresolved), with a few settled effects."""
        tenant = self.tenants[0]
        plan, _ = self.plan(RecoveryState.AMBIGUOUS, tenant)
        plan.template = self.templates[PhaseClass.IN_FLIGHT][0]  # runifold.agent
        plan.created_at = plan.last_write_at - timedelta(seconds=2 * revisions)
        effects = [EffectState.CONFIRMED] * 6 + [EffectState.UNRESOLVED]
        self._write([(tenant, run_uuid, plan, effects, revisions)])

    def _write(self, plans) -> None:
        t = self.tables
        run_ids = t[Run].ids(len(plans))
        cp_ids = t[Checkpoint].ids(len(plans))
        effects = [self._effects(states, plan.created_at, run_uuid)
                   for _, run_uuid, plan, states, _ in plans]
        effect_ids = iter(t[Effect].ids(sum(len(e) for e in effects)))
        for (tenant, run_uuid, plan, _, k), run_effects, run_id, cp_id in zip(
                plans, effects, run_ids, cp_ids, strict=True):
            self._run_rows(tenant, run_uuid, plan, run_effects, effect_ids, k, run_id, cp_id)
        with transaction.atomic():
            for model in (Run, Checkpoint, CheckpointRevision, RetryRequest, Effect,
                          EffectRevision, Conflict):
                t[model].flush()

    def _run_rows(self, tenant: _Tenant, run_uuid, plan: _RunPlan, effects: list[_Effect],
                  effect_ids, k: int, run_id: int, cp_id: int) -> None:
        # Long on purpose: one run's rows for every table, in the order of their foreign
        # keys, so the data set matches what the services would have written.
        t, rng, tid = self.tables, self.rng, tenant.tenant.pk
        users = tenant.users
        writer = users["writer"]
        tpl = plan.template
        # -- checkpoint and its history (oldest first; the last one is the checkpoint row)
        same_kind = self.history.get((tpl.kind, tpl.schema_version)) or [tpl]
        span = (plan.last_write_at - plan.created_at).total_seconds()
        for rev in range(k):
            x = tpl if rev == k - 1 else same_kind[rev % len(same_kind)]
            at = plan.created_at + timedelta(seconds=span * (rev + 1) / k)
            if rev == k - 1:
                at = plan.last_write_at
            t[CheckpointRevision].add(
                tenant_id=tid, checkpoint_id=cp_id, revision=rev, kind=x.kind,
                schema_version=x.schema_version, payload_ciphertext=x.ciphertext,
                payload_size=x.size, phase_class=x.phase_class, phase_label=x.phase_label,
                updated_at_ms=int(at.timestamp() * 1000), received_at=at,
                written_by_id=writer.pk)
        cp_uuid = uuid.uuid4()
        t[Checkpoint].add(
            id=cp_id, tenant_id=tid, run_id=run_id, uuid=cp_uuid, revision=k - 1,
            kind=tpl.kind, schema_version=tpl.schema_version, payload_ciphertext=tpl.ciphertext,
            payload_size=tpl.size, phase_class=tpl.phase_class, phase_label=tpl.phase_label,
            updated_at_ms=int(plan.last_write_at.timestamp() * 1000),
            received_at=plan.last_write_at, written_by_id=writer.pk)
        # -- effects and their history
        for e in effects:
            eid = next(effect_ids)
            path = EFFECT_PATHS[e.state]
            when = e.created_at
            submitted_at = None
            for rev, (state, source) in enumerate(path):
                if state == EffectState.SUBMITTED:
                    submitted_at = when
                receipt = (self.receipt if state == EffectState.CONFIRMED
                           else self.failure if state == EffectState.FAILED else "")
                actor = {EffectSource.RUNTIME: writer.username,
                         EffectSource.REVIEWER: users["reviewer"].username}.get(source, "system")
                t[EffectRevision].add(tenant_id=tid, effect_id=eid, revision=rev, state=state,
                                      receipt_ciphertext=receipt, attempt=1, actor_name=actor,
                                      source=source, created_at=when)
                if rev < len(path) - 1:
                    when = min(plan.last_write_at, when + timedelta(seconds=2))
            t[Effect].add(
                id=eid, tenant_id=tid, run_id=run_id, uuid=e.uuid, revision=len(path) - 1,
                operation_key=e.key, service=e.service, effect_class=e.effect_class,
                request_fingerprint=hashlib.sha256(e.key.encode()).hexdigest(), state=e.state,
                receipt_ciphertext=(self.receipt if e.state == EffectState.CONFIRMED
                                    else self.failure if e.state == EffectState.FAILED else ""),
                attempt=1, state_changed_at=when, submitted_at=submitted_at,
                created_at=e.created_at, updated_at=when)
        # -- conflicts (refused writes of a stale revision), unacknowledged
        for _ in range(plan.conflicts):
            t[Conflict].add(
                tenant_id=tid, run_id=run_id, target_type=TargetType.CHECKPOINT,
                target_uuid=cp_uuid, reason=ConflictReason.STALE_REVISION,
                expected_revision=max(0, k - 2), actual_revision=k - 1, attempted_revision=k - 1,
                writer_id=writer.pk, writer_name=writer.username,
                refused_ciphertext=tpl.ciphertext, created_at=plan.last_write_at)
        if plan.state == RecoveryState.COMPLETED and rng.random() < 0.05:
            t[Conflict].add(  # an old refusal a reviewer acknowledged
                tenant_id=tid, run_id=run_id, target_type=TargetType.CHECKPOINT,
                target_uuid=cp_uuid, reason=ConflictReason.STALE_REVISION,
                expected_revision=0, actual_revision=1, attempted_revision=1,
                writer_id=writer.pk, writer_name=writer.username, refused_ciphertext="",
                created_at=plan.created_at, acknowledged_at=plan.last_write_at,
                acknowledged_by_id=users["reviewer"].pk)
            self.counts["conflicts"] += 1
        # -- retry request
        if plan.retry_state:
            decided = plan.retry_state == RetryState.APPROVED
            preview = None
            if decided:
                preview = []
                for e in effects:
                    outcome, words = policy.retry_outcome(e.state)
                    preview.append({"effect_id": str(e.uuid), "service": e.service,
                                    "operation_key": e.key, "state": e.state,
                                    "outcome": outcome, "words": words})
            asked_at = min(self.now, plan.last_write_at + timedelta(minutes=10))
            t[RetryRequest].add(
                tenant_id=tid, run_id=run_id, state=plan.retry_state,
                requested_by_id=users["reviewer"].pk,
                reason="the payment provider cannot tell; the customer asked again",
                decided_by_id=users["approver"].pk if decided else None,
                decision_reason="duplicate accepted: the card is refunded if charged twice"
                if decided else "",
                decided_at=min(self.now, asked_at + timedelta(minutes=5)) if decided else None,
                approved_preview=preview, created_at=asked_at, updated_at=asked_at)
        # -- the run, in the state policy.recovery_state gives for these facts
        counts: dict[str, int] = {}
        labels: dict[str, list[str]] = {}
        for e in effects:
            counts[e.state] = counts.get(e.state, 0) + 1
            if e.state in EffectState.DOUBTFUL and len(labels.get(e.state, [])) < 3:
                labels.setdefault(e.state, []).append(f"{e.service} {e.key}")
        ident = tpl.identity
        planned_run = Run(phase_class=tpl.phase_class, phase_label=tpl.phase_label,
                          last_write_at=plan.last_write_at, lease_owner=plan.lease_owner,
                          lease_expires_at=plan.lease_expires_at,
                          unacknowledged_conflicts=plan.conflicts, agent=ident.agent,
                          model=ident.model, workflow=ident.workflow,
                          definition_version=ident.definition_version,
                          closed_at=self.now if plan.closed else None)
        facts = policy.RunFacts.of(planned_run, now=self.now,
                                   ambiguity_threshold_s=self.threshold[tid],
                                   effect_states=counts, open_retry_state=plan.retry_state,
                                   effect_labels=labels)
        state, reason = policy.recovery_state(facts)
        if state != plan.state:
            raise CommandError(f"generate_load: a run planned {plan.state} is {state} "
                               f"({reason}); the generator is out of step with policy")
        changed = None
        if state != RecoveryState.HEALTHY:
            changed = plan.last_write_at
            if state == RecoveryState.AMBIGUOUS:  # the sweep noticed the owner had gone
                changed = min(self.now, (facts.owner_gone_at or plan.last_write_at)
                              + timedelta(seconds=5))
        supported = tpl.phase_class != PhaseClass.UNSUPPORTED
        t[Run].add(
            id=run_id, tenant_id=tid, uuid=run_uuid, kind=tpl.kind,
            schema_version=tpl.schema_version,
            agent=ident.agent if supported else "", model=ident.model if supported else "",
            workflow=ident.workflow if supported else "",
            definition_version=ident.definition_version if supported else "",
            phase_class=tpl.phase_class, phase_label=tpl.phase_label, latest_checkpoint_id=cp_id,
            recovery_state=state, recovery_reason=reason[:256], state_changed_at=changed,
            last_write_at=plan.last_write_at, lease_owner=plan.lease_owner,
            lease_expires_at=plan.lease_expires_at, fencing_token=plan.fencing_token,
            unacknowledged_conflicts=plan.conflicts,
            closed_at=min(self.now, plan.last_write_at + timedelta(hours=1))
            if plan.closed else None,
            closed_by_id=users["reviewer"].pk if plan.closed else None,
            closed_reason="refunded by hand in the payment provider's console"
            if plan.closed else "",
            created_at=plan.created_at, updated_at=plan.last_write_at)
        c = self.counts
        c["runs"] += 1
        c["checkpoint revisions"] += k
        c["effects"] += len(effects)
        c["effect revisions"] += sum(len(EFFECT_PATHS[e.state]) for e in effects)
        c["conflicts"] += plan.conflicts
        c["retry requests"] += bool(plan.retry_state)
