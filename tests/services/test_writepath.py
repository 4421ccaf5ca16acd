"""The checkpoint update's SQL path (``checkpoints.services.writepath``, PostgreSQL) writes exactly
what the ORM path (the reference, and SQLite's only path) writes (issue 8).

One script of writes runs twice on the same ids: in acme with the SQL path, in globex
with ``RECOVERY_SQL_WRITE_PATH`` off. Every row it leaves (runs, checkpoints, revisions,
conflicts, audit events) is then compared column by column, leaving out only what
differs by nature (primary keys, the tenant, times, Fernet ciphertexts, whose payloads are
compared decrypted). Both audit chains must verify.
"""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection

from checkpoints import crypto, services
from checkpoints.exceptions import Fenced, StaleRevision, UsageDecreased
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Conflict, Run
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, walk_effect

pytestmark = pytest.mark.postgres

CP, RUN, EFFECT = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
TIMES = {"created_at", "updated_at", "last_write_at", "state_changed_at", "received_at",
         "closed_at", "lease_expires_at", "submitted_at"}
SKIP = {"id", "tenant", "tenant_id", "run", "run_id", "checkpoint", "checkpoint_id",
        "latest_checkpoint", "latest_checkpoint_id", "written_by", "written_by_id",
        "closed_by", "closed_by_id", "writer", "writer_id", "actor", "actor_id", "hash",
        "prev_hash", "refused_ciphertext", "writer_name"}


def body(revision, phase="ready", **extra):
    extra.setdefault("updated_at_ms", 1_700_000_000_000 + revision)
    return envelope(checkpoint_id=CP, run_id=RUN, revision=revision,
                    payload={"phase": phase, "order_id": "A-1042", "step": revision}, **extra)


def script(writer, reviewer, tenant):
    """The same writes for either path; returns what each step answered."""
    answers = []

    def put(b, expected, token=None):
        try:
            cp = put_checkpoint(writer, tenant, b, expected=expected, token=token)
            answers.append(("ok", cp.revision, cp.phase_class, cp.payload_size))
        except (StaleRevision, Fenced) as exc:
            answers.append((type(exc).__name__,))

    put(body(0), None)                                   # create (ORM path in both)
    put(body(1), 0)                                      # plain update
    put(body(2, phase="charging"), 1)                    # in flight
    walk_effect(writer, tenant, effect_body(effect_id=EFFECT, run_id=RUN),
                "submitted", "unresolved")               # an effect in doubt: labels
    put(body(3, phase="charging"), 2)
    put(body(3), 2)                                      # stale: a conflict row
    age_world(3600)
    services.run_close(actor=reviewer, tenant=tenant, run_id=RUN, reason="handled by phone")
    put(body(4), 3)                                      # reopens the closed run
    put(body(5, schema_version=99), 4)                   # unsupported schema
    put(body(6, phase="done"), 5)                        # completed
    age_world(3600)
    run = services.lease_acquire(actor=writer, tenant=tenant, run_id=RUN, owner="w1", ttl_s=60)
    put(body(7), 6)                                      # fenced: no token
    put(body(7), 6, token=run.fencing_token + 1)         # fenced: wrong token
    put(body(7), 6, token=run.fencing_token)             # accepted
    return answers


def rows(tenant):
    """Every row the script leaves, without what differs by nature."""
    def clean(obj, extra=None):
        out = {}
        for f in obj._meta.concrete_fields:
            if f.name in SKIP or f.attname in SKIP:
                continue
            value = getattr(obj, f.attname)
            out[f.name] = (value is not None) if f.name in TIMES else value
        if hasattr(obj, "payload_ciphertext"):
            out["payload_ciphertext"] = crypto.decrypt_text(obj.payload_ciphertext)
        return out | (extra or {})

    runs = [clean(r, {"latest": r.latest_checkpoint.revision if r.latest_checkpoint else None,
                      "closed_by": r.closed_by_id is not None})
            for r in Run.objects.for_tenant(tenant).order_by("uuid")]
    cps = [clean(c, {"by": c.written_by.username[:1]}) for c in
           Checkpoint.objects.for_tenant(tenant).order_by("uuid")]
    revs = [clean(r, {"by": r.written_by.username[:1]}) for r in
            CheckpointRevision.objects.for_tenant(tenant).order_by("checkpoint__uuid", "revision")]
    conflicts = [clean(c) for c in Conflict.objects.for_tenant(tenant).order_by("id")]
    def untimed(d):
        return {k: v for k, v in d.items() if k != "expires_at"} if d else d

    # In append order (``seq``: the row's id since issue 22, so not equal across tenants).
    events = [(e.action, e.target_type, e.target_ref, e.run_uuid, e.before,
               untimed(e.after), e.reason, e.hash_scheme)
              for e in AuditEvent.objects.for_tenant(tenant).order_by("seq")
              if e.action not in {"tenant.create", "role.grant", "account.create"}]
    return {"runs": runs, "checkpoints": cps, "revisions": revs, "conflicts": conflicts,
            "events": events}


@pytest.fixture
def sql_path_used(monkeypatch):
    """Counts the SQL path's successful writes (so the comparison cannot pass by both
    tenants taking the ORM path)."""
    from checkpoints.services import writepath

    calls = {"written": 0, "refused": 0}
    real = writepath.checkpoint_update

    def counting(**kwargs):
        answer = real(**kwargs)
        if isinstance(answer, (StaleRevision, UsageDecreased)):
            calls["refused"] += 1
        elif answer is not writepath.FALLBACK:
            calls["written"] += 1
        return answer

    monkeypatch.setattr(writepath, "checkpoint_update", counting)
    return calls


@pytest.mark.django_db
def test_the_sql_path_writes_what_the_orm_path_writes(acme, globex, wendy, wes, rita, omar,
                                                      settings, sql_path_used):
    settings.RECOVERY_SQL_WRITE_PATH = True
    fast = script(wendy, rita, acme)
    assert sql_path_used == {"written": 7, "refused": 1}  # revisions 1 to 7, the stale one
    settings.RECOVERY_SQL_WRITE_PATH = False
    slow = script(wes, omar, globex)
    assert sql_path_used == {"written": 7, "refused": 1}  # unchanged: globex took the ORM
    assert fast == slow
    assert [a[0] for a in fast].count("Fenced") == 2
    assert [a[0] for a in fast].count("StaleRevision") == 1
    fast_rows, slow_rows = rows(acme), rows(globex)
    for table in fast_rows:
        assert fast_rows[table] == slow_rows[table], table
    assert services.audit_verify(tenant=acme)[0]
    assert services.audit_verify(tenant=globex)[0]


@pytest.mark.django_db
def test_a_leased_update_through_the_sql_path(acme, wendy, settings, sql_path_used):
    """With a lease, the token is checked by the SQL path and the write goes through it."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    put_checkpoint(wendy, acme, body(0))
    run = services.lease_acquire(actor=wendy, tenant=acme, run_id=RUN, owner="w1", ttl_s=60)
    put_checkpoint(wendy, acme, body(1), expected=0, token=run.fencing_token)
    assert sql_path_used["written"] == 1
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, body(2), expected=1)
    assert Conflict.objects.for_tenant(acme).get().reason == "fenced"
    assert Checkpoint.objects.for_tenant(acme).get().revision == 1


def round_trips(conn, do) -> int:
    """How many times ``do()`` waited for the server on ``conn``: in libpq's protocol
    trace, each run of messages the client sent (``F``) that the server then answered
    (``B``), pipelined ones included."""
    import os
    import tempfile
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            do()
        finally:
            conn.pgconn.untrace()
        trace.flush()
        os.lseek(trace.fileno(), 0, os.SEEK_SET)
        lines = os.read(trace.fileno(), 10_000_000).decode().splitlines()
    sides = [line.split("\t")[1] for line in lines if line.count("\t") >= 3]
    return sum(1 for a, b in zip(sides, sides[1:], strict=False) if (a, b) == ("F", "B"))


@pytest.mark.django_db(transaction=True)
def test_an_update_is_two_round_trips_whatever_the_history(acme, wendy, settings):
    """BEGIN + lock (the gate shared, the run, the facts read after it), then compare-and-
    swap + history + run + audit event + COMMIT (their results come with the pipeline's
    closing sync): the same for the 2nd and the 60th revision (issue 22, item 2)."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    put_checkpoint(wendy, acme, body(0))
    counts = []
    for rev in range(1, 61):
        if rev in (1, 60):
            counts.append(round_trips(connection.connection, lambda rev=rev: put_checkpoint(
                wendy, acme, body(rev), expected=rev - 1)))
        else:
            put_checkpoint(wendy, acme, body(rev), expected=rev - 1)
    assert counts == [2, 2], "BEGIN + lock; write + COMMIT with the pipeline's closing sync"
    assert Checkpoint.objects.for_tenant(acme).get().revision == 60


@pytest.mark.django_db(transaction=True)
def test_a_stale_write_is_refused_and_recorded_in_the_same_two_round_trips(acme, wendy,
                                                                           settings):
    """A stale revision: BEGIN + lock, then the conflict row, the run's count and state
    and the audit event + COMMIT (issue 22: "contended at least 0.15x, every refusal
    recorded"); the refusal is raised after its record committed."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    put_checkpoint(wendy, acme, body(0))
    put_checkpoint(wendy, acme, body(1), expected=0)
    events = AuditEvent.objects.for_tenant(acme).count()
    answers = []

    def stale():
        try:
            put_checkpoint(wendy, acme, body(1), expected=0)
        except StaleRevision as exc:
            answers.append(exc)

    assert round_trips(connection.connection, stale) == 2
    assert len(answers) == 1
    conflict = Conflict.objects.for_tenant(acme).get()
    assert (conflict.expected_revision, conflict.actual_revision,
            conflict.attempted_revision, conflict.reason) == (0, 1, 1, "stale_revision")
    run = Run.objects.for_tenant(acme).get(uuid=RUN)
    assert run.unacknowledged_conflicts == 1 and run.recovery_state == "conflicted"
    assert AuditEvent.objects.for_tenant(acme).count() == events + 1
    assert Checkpoint.objects.for_tenant(acme).get().revision == 1


@pytest.mark.django_db
def test_the_round_trip_counter_sees_each_round_trip(acme):
    """The counter of the test above counts one per statement outside a pipeline."""
    def three():
        with connection.cursor() as cursor:
            for _ in range(3):
                cursor.execute("SELECT 1")
    assert round_trips(connection.connection, three) == 3


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql", "orm"])
@pytest.mark.django_db
def test_an_accepted_write_is_the_runs_last_write_on_both_dialects(acme, wendy, settings,
                                                                   sql_path):
    """The run's ``last_write_at`` (what the sweep reads as "the runtime is alive") is the
    database time of the write that was accepted, whichever dialect wrote it."""
    settings.RECOVERY_SQL_WRITE_PATH = sql_path
    put_checkpoint(wendy, acme, body(0))
    age_world(3600)
    cp = put_checkpoint(wendy, acme, body(1, phase="charging"), expected=0)
    run = Run.objects.for_tenant(acme).get(uuid=RUN)
    stored = Checkpoint.objects.for_tenant(acme).get(uuid=CP)
    assert stored.revision == cp.revision == 1
    assert run.last_write_at == stored.received_at


@pytest.mark.django_db
def test_the_update_statement_fits_psycopgs_conversion_cache(acme, wendy, settings):
    """psycopg converts a statement's ``%(name)s`` placeholders once and caches the result
    only up to ``MAX_CACHED_STATEMENT_PARAMS`` parameters: past it, every write parses
    the statement again (issue 22, item 2). Both update statements (with and without the
    payload's identity) stay within ``WRITE_PARAMS_MAX``, which stays within psycopg's."""
    from psycopg import _queries

    from checkpoints.services import writepath

    settings.RECOVERY_SQL_WRITE_PATH = True
    seen = []

    def spy(execute, sql_text, params, many, context):
        if sql_text.startswith("WITH upd"):
            seen.append((sql_text, params))
        return execute(sql_text, params, many, context)

    put_checkpoint(wendy, acme, body(0))
    with connection.execute_wrapper(spy):
        put_checkpoint(wendy, acme, body(1), expected=0)
    assert len(seen) == 1
    assert writepath.WRITE_PARAMS_MAX <= _queries.MAX_CACHED_STATEMENT_PARAMS
    for statement in writepath._sql().write.values():
        names = set(re.findall(r"%\((\w+)\)s", statement))
        assert len(names) <= writepath.WRITE_PARAMS_MAX, len(names)
    sql_text, params = seen[0]
    assert set(params) == set(re.findall(r"%\((\w+)\)s", sql_text))  # nothing unused sent


@pytest.mark.django_db(transaction=True)
def test_the_store_statements_are_prepared_once_they_repeat(acme, wendy, settings):
    """Straight to PostgreSQL (no ``RECOVERY_PGBOUNCER``), the lock, the update and the
    API's token read are prepared on the server after a few runs on a connection, so
    they are no longer parsed and planned on every request (issue 22, items 2 and 3);
    Django's own statements (client-side binding) never are."""
    from checkpoints.api.auth import token_user

    assert connection.settings_dict["OPTIONS"].get("prepare_threshold") == 5
    settings.RECOVERY_SQL_WRITE_PATH = True
    put_checkpoint(wendy, acme, body(0))
    for rev in range(1, 8):
        put_checkpoint(wendy, acme, body(rev), expected=rev - 1)
    raw = services.token_issue(user=wendy)
    for _ in range(7):
        user = token_user(raw, tenant_slug=acme.slug)
        assert user == wendy
    with connection.cursor() as cursor:
        for _ in range(7):
            cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any(s.startswith("WITH upd") for s in prepared), prepared
    assert any("checkpoints_write_lock_v2" in s for s in prepared), prepared
    assert any("checkpoints_apitoken" in s for s in prepared), prepared
    assert not any("pg_prepared_statements" in s for s in prepared), prepared


def _other_connection():
    """A connection of its own to the test database (another process's, for DDL or a kill)."""
    from tests.api.test_lean_path import _psycopg_connect

    return _psycopg_connect()


@pytest.mark.parametrize("table, column, wide, narrow", [
    ("auth_user", "last_name", "varchar(300)", "varchar(150)"),
    ("checkpoints_tenant", "name", "varchar(400)", "varchar(200)"),
])
@pytest.mark.django_db(transaction=True)
def test_the_prepared_token_read_survives_a_migration_run_by_another_process(
        acme, wendy, table, column, wide, narrow):
    """A deploy runs ``migrate`` in another process while web processes keep their
    connections (``CONN_MAX_AGE``): a column the prepared token read returns changes
    type, which PostgreSQL cannot replan ("cached plan must not change result type").
    The next request on the same connection still authenticates, and so do the ones
    after it (an attack's finding: each was a 500 until the connection aged out)."""
    from checkpoints.api.auth import token_user
    from checkpoints.models import Tenant

    assert Tenant._meta.get_field("name").max_length == 200  # the narrow type below
    raw = services.token_issue(user=wendy)
    for _ in range(7):  # prepared from the 5th run on this connection
        assert token_user(raw, tenant_slug=acme.slug) == wendy
    try:
        with _other_connection() as other:
            other.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {wide}')
        for _ in range(3):
            assert token_user(raw, tenant_slug=acme.slug) == wendy
    finally:
        with _other_connection() as other:
            other.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {narrow}')


@pytest.mark.django_db(transaction=True)
def test_a_usage_refusal_is_recorded_in_the_same_two_round_trips(acme, wendy, settings):
    """A usage counter going back (CONTRACT.md 8) is refused like a stale revision: two
    round trips, its conflict (``usage_decreased``) committed before it is raised."""
    from checkpoints.exceptions import UsageDecreased
    from tests.services.test_usage import agent_body

    settings.RECOVERY_SQL_WRITE_PATH = True
    ids = (uuid.uuid4(), uuid.uuid4())
    put_checkpoint(wendy, acme, agent_body(0, ids=ids, tokens=100))
    put_checkpoint(wendy, acme, agent_body(1, ids=ids, tokens=120), expected=0)
    answers = []

    def lower():
        try:
            put_checkpoint(wendy, acme, agent_body(2, ids=ids, tokens=90), expected=1)
        except UsageDecreased as exc:
            answers.append(exc)

    assert round_trips(connection.connection, lower) == 2
    assert [a.body()["counter"] for a in answers] == ["tokens"]
    conflict = Conflict.objects.for_tenant(acme).get()
    assert (conflict.reason, conflict.expected_revision, conflict.actual_revision,
            conflict.attempted_revision) == ("usage_decreased", 1, 1, 2)


@pytest.mark.django_db(transaction=True)
def test_a_write_first_after_the_server_closed_the_connection_reconnects(acme, wendy,
                                                                         settings):
    """A task whose first statement is the SQL path's write (no request's token read
    before it): Django's per-request health check runs before the pipeline, so a
    connection the server closed is replaced instead of failing the write."""
    import time

    from django.db import close_old_connections

    settings.RECOVERY_SQL_WRITE_PATH = True
    put_checkpoint(wendy, acme, body(0))
    pid = connection.connection.info.backend_pid
    with _other_connection() as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    time.sleep(0.3)
    close_old_connections()  # what a request's or a task's start does
    assert put_checkpoint(wendy, acme, body(1), expected=0).revision == 1
    assert connection.connection.info.backend_pid != pid


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql", "orm"])
@pytest.mark.django_db
def test_a_refusals_audit_event_is_stamped_with_its_conflicts_database_time(
        acme, wendy, settings, sql_path):
    """Both dialects stamp a refused write's conflict and its audit event with the time
    read with the run's lock (an attack's finding: the ORM path's event took the process
    clock)."""
    settings.RECOVERY_SQL_WRITE_PATH = sql_path
    put_checkpoint(wendy, acme, body(0))
    put_checkpoint(wendy, acme, body(1), expected=0)
    with pytest.raises(StaleRevision):
        put_checkpoint(wendy, acme, body(1), expected=0)
    conflict = Conflict.objects.for_tenant(acme).get()
    event = AuditEvent.objects.for_tenant(acme).get(action="checkpoint.conflict")
    assert event.created_at == conflict.created_at
