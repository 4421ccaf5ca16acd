"""Write scenarios: one checkpoint update per operation, in writer processes.

Every scenario runs ``writers`` processes (forked after the parent closed its database
connections; each opens its own). Each process sets itself up (connection, its own
checkpoint), waits at a barrier, writes for ``warmup`` seconds unmeasured, then for
``seconds`` measured, and reports its latencies, accepted writes and refusals. Afterwards
the parent checks the database: for an uncontended scenario every checkpoint's revision
is its start plus the writes accepted, with one history row per revision (no lost
update); contended, the revisions gained equal the wins, and for the services variant
every refusal left a ``Conflict`` row.

Variants (the same ~1.2 KB ``runifold.agent`` payload, ``common.payloads``):

- ``raw``: psycopg, autocommit, the CAS ``UPDATE ... WHERE id AND revision RETURNING``
  and the history ``INSERT`` in one statement (a CTE): the reference. The payload is
  serialised and encrypted per write, as the store does;
- ``orm``: Django, ``filter(revision=N).update(...)`` + ``CheckpointRevision.create`` in
  one transaction;
- ``services``: ``services.checkpoint_put`` (validation, CAS, history, run state, audit
  event, one transaction), an envelope made by ``services.parse_envelope``;
- ``http``: ``PUT`` through gunicorn (``gunicorn.conf.py``) with the runtime client
  ``recovery_client.client.HttpCheckpointStore`` over one keep-alive connection per process
  (``KeepAliveStore``: the stock client opens a connection per request);
- ``floor``: the same ``PUT`` and client against ``bench/floor_wsgi.py``, a bare WSGI app
  under the same gunicorn settings (token, JSON, the product's encryption, one CAS+history
  statement): the floor of a Python HTTP store on this stack (issue 22);
- ``services-tenant``: ``services.checkpoint_put`` by 4 and 16 writers in one tenant, and
  as many in as many tenants (the per-tenant bottleneck, issue 22);
- ``langgraph`` / ``recoverysaver``: LangGraph's ``PostgresSaver.put`` (its own tables,
  same database, append-only, no CAS) and ``RecoverySaver.put`` through gunicorn, the same
  chains of checkpoints (``bench.bench_langgraph``), the payload as a channel value.

Scenarios run in interleaved rounds: each round runs every scenario once, and the report
(``bench.report``) compares a product with its reference within a round.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import random
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bench.common import (
    GUNICORN_ARGS,
    ROOT,
    free_port,
    percentile,
    wait_for_port,
    wait_until_ready,
)

# --------------------------------------------------------------------------------------
# Running writer processes
# --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One writer process's report."""

    latencies_ms: list[float] = field(default_factory=list)
    accepted: int = 0  # every accepted write, warm-up included
    refused: int = 0
    measured_refused: int = 0
    start: float = 0.0
    end: float = 0.0
    error: str = ""


def _child(make_op, spec, barrier, queue, warmup: float, seconds: float) -> None:
    out = Outcome()
    try:
        op = make_op(spec)
        barrier.wait(timeout=300)
        t0 = time.monotonic()
        warm_until, until = t0 + warmup, t0 + warmup + seconds
        now = t0
        while now < warm_until:
            if op():
                out.accepted += 1
            else:
                out.refused += 1
            now = time.monotonic()
        out.start = now
        lat = out.latencies_ms
        while now < until:
            a = time.perf_counter()
            ok = op()
            lat.append((time.perf_counter() - a) * 1000)
            if ok:
                out.accepted += 1
            else:
                out.refused += 1
                out.measured_refused += 1
            now = time.monotonic()
        out.end = now
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the row
        out.error = traceback.format_exc(limit=8)
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
    queue.put(out)


def run_writers(make_op, specs: list, *, warmup: float, seconds: float) -> list[Outcome]:
    """Fork one process per spec running ``make_op(spec)()`` in a loop; their outcomes."""
    from django.db import connections

    connections.close_all()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(specs) + 1)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(make_op, s, barrier, queue, warmup, seconds))
             for s in specs]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=300)
    except Exception:  # noqa: BLE001 - a child failed its set-up; its outcome says why
        pass
    outcomes = [queue.get(timeout=warmup + seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return outcomes


def summarise(outcomes: list[Outcome]) -> dict:
    errors = [o.error for o in outcomes if o.error]
    lat = [v for o in outcomes for v in o.latencies_ms]
    starts = [o.start for o in outcomes if o.end]
    ends = [o.end for o in outcomes if o.end]
    wall = (max(ends) - min(starts)) if starts else 0.0
    ops = len(lat)
    measured_refused = sum(o.measured_refused for o in outcomes)
    return {
        "ops": ops,
        "wall_s": round(wall, 3),
        "ops_per_s": round(ops / wall, 1) if wall else 0.0,
        "accepted_per_s": round((ops - measured_refused) / wall, 1) if wall else 0.0,
        "p50_ms": round(percentile(lat, 0.50), 3),
        "p99_ms": round(percentile(lat, 0.99), 3),
        "accepted": sum(o.accepted for o in outcomes),
        "refused": sum(o.refused for o in outcomes),
        "errors": errors,
    }


# --------------------------------------------------------------------------------------
# Set-up: tenants, writers, checkpoints (through the services, untimed)
# --------------------------------------------------------------------------------------


@dataclass
class Target:
    """One checkpoint a writer updates."""

    tenant_slug: str
    checkpoint_id: uuid.UUID
    run_id: uuid.UUID
    pk: int
    tenant_id: int
    writer_username: str
    start_revision: int = 0


class Fixture:
    """Tenants ``bench-*`` with a writer each (and a bearer token), and checkpoints made
    through ``services.checkpoint_put`` at revision 0."""

    def __init__(self):
        self.tenants: dict = {}
        self.writers: dict = {}
        self.tokens: dict = {}
        self.payloads = None

    def tenant(self, slug: str):
        from checkpoints import services

        if slug not in self.tenants:
            tenant = services.tenant_create(slug=slug, name=f"bench {slug}")
            writer = services.account_create(username=f"{slug}-writer", service=True)
            services.role_grant(actor=None, tenant=tenant, user=writer, role="writer")
            self.tenants[slug] = tenant
            self.writers[slug] = writer
            self.tokens[slug] = services.token_issue(user=writer)
        return self.tenants[slug]

    def checkpoint(self, slug: str) -> Target:
        from checkpoints import services
        from checkpoints.models import Checkpoint

        tenant = self.tenant(slug)
        cid, rid = uuid.uuid4(), uuid.uuid4()
        body = envelope(cid, rid, 0, payload_at(self.payloads, 0))
        services.checkpoint_put(actor=self.writers[slug], tenant=tenant,
                                envelope=services.parse_envelope(body, url_id=cid),
                                expected_revision=None)
        pk = Checkpoint.objects.for_tenant(tenant).get(uuid=cid).pk
        return Target(slug, cid, rid, pk, tenant.pk, self.writers[slug].username)


def payload_at(payloads: list[dict], revision: int) -> dict:
    """The payload written as ``revision``: the payloads in turn, with usage counters that
    grow with the revision, as a runtime's do (the store refuses a write whose usage goes
    back, CONTRACT.md 8)."""
    from checkpoints.kinds import USAGE_COUNTERS  # after django.setup(), as every import here

    payload = dict(payloads[revision % len(payloads)])
    payload["usage"] = dict.fromkeys(USAGE_COUNTERS, revision)
    return payload


def envelope(cid: uuid.UUID, rid: uuid.UUID, revision: int, payload: dict) -> dict:
    return {"id": str(cid), "run_id": str(rid), "revision": revision,
            "kind": "runifold.agent", "schema_version": 1, "payload": payload,
            "updated_at_ms": int(time.time() * 1000)}


# --------------------------------------------------------------------------------------
# Operations (each ``make_*`` runs in the writer process and returns ``op() -> bool``)
# --------------------------------------------------------------------------------------


def _prepared(payloads: list[dict]) -> list[tuple[dict, str, int, str, str]]:
    """(payload, JSON text, size, phase class, label) per payload: what the raw and ORM
    references store besides the ciphertext."""
    from checkpoints import kinds
    from checkpoints.jsonparse import dumps

    out = []
    for p in payloads:
        text = dumps(p)
        cls = kinds.classify("runifold.agent", 1, p)
        out.append((p, text, len(text.encode()), cls.phase.phase_class, cls.phase.label))
    return out


def _raw_sql() -> str:
    from checkpoints.models import Checkpoint, CheckpointRevision

    cols = ("tenant_id, revision, kind, schema_version, payload_ciphertext, payload_size, "
            "phase_class, phase_label, updated_at_ms, usage, received_at, written_by_id")
    return (
        f"WITH u AS (UPDATE {Checkpoint._meta.db_table} SET revision = %(new)s, "
        f"payload_ciphertext = %(ct)s, payload_size = %(size)s, phase_class = %(pc)s, "
        f"usage = %(usage)s, "
        f"phase_label = %(pl)s, updated_at_ms = %(ms)s, received_at = statement_timestamp() "
        f"WHERE id = %(id)s AND revision = %(expected)s RETURNING id, {cols}) "
        f"INSERT INTO {CheckpointRevision._meta.db_table} (checkpoint_id, {cols}) "
        f"SELECT id, {cols} FROM u RETURNING revision")


def _json_text(text: str, revision: int) -> str:
    # A different payload text per write (as a runtime's would be) at no measurable cost.
    return text[:-1] + f',"bench_revision":{revision}}}'


def make_raw(spec: dict):
    """``spec``: dsn, targets (list of ``Target``; one unless contended), payloads."""
    import psycopg

    from checkpoints import crypto, kinds
    from checkpoints.models import Checkpoint

    conn = psycopg.connect(spec["dsn"], autocommit=True)
    sql = _raw_sql()
    read = f"SELECT revision FROM {Checkpoint._meta.db_table} WHERE id = %s"
    prepared = _prepared(spec["payloads"])
    targets = spec["targets"]
    rng = random.Random(spec.get("seed", 0))
    revision = {t.pk: t.start_revision for t in targets}

    def op() -> bool:
        t = targets[0] if len(targets) == 1 else rng.choice(targets)
        if len(targets) > 1:  # contended: read the current revision first
            revision[t.pk] = conn.execute(read, [t.pk]).fetchone()[0]
        current = revision[t.pk]
        _, text, size, pc, pl = prepared[(current + 1) % len(prepared)]
        row = conn.execute(sql, {
            "new": current + 1, "ct": crypto.encrypt_text(_json_text(text, current + 1), tenant=t.tenant_id),
            "size": size, "pc": pc, "pl": pl, "ms": int(time.time() * 1000), "id": t.pk,
            "usage": json.dumps(dict.fromkeys(kinds.USAGE_COUNTERS, current + 1)),
            "expected": current}).fetchone()
        if row is None:
            return False
        revision[t.pk] = current + 1
        return True

    return op


def make_orm(spec: dict):
    from django.db import transaction
    from django.db.models.functions import Now
    from django.utils import timezone

    from checkpoints import crypto
    from checkpoints.models import Checkpoint, CheckpointRevision

    (t,) = spec["targets"]
    prepared = _prepared(spec["payloads"])
    state = {"rev": t.start_revision}
    writer_id = spec["writer_id"]

    def op() -> bool:
        current = state["rev"]
        _, text, size, pc, pl = prepared[(current + 1) % len(prepared)]
        ct = crypto.encrypt_text(_json_text(text, current + 1), tenant=t.tenant_id)
        ms = int(time.time() * 1000)
        with transaction.atomic():
            n = Checkpoint.objects.for_tenant(t.tenant_id).filter(
                pk=t.pk, revision=current).update(
                revision=current + 1, payload_ciphertext=ct, payload_size=size,
                phase_class=pc, phase_label=pl, updated_at_ms=ms, received_at=Now())
            if n != 1:
                return False
            CheckpointRevision.objects.create(
                tenant_id=t.tenant_id, checkpoint_id=t.pk, revision=current + 1,
                kind="runifold.agent", schema_version=1, payload_ciphertext=ct,
                payload_size=size, phase_class=pc, phase_label=pl, updated_at_ms=ms,
                received_at=timezone.now(), written_by_id=writer_id)
        state["rev"] = current + 1
        return True

    return op


def make_services(spec: dict):
    from django.contrib.auth import get_user_model

    from checkpoints import services
    from checkpoints.exceptions import StaleRevision
    from checkpoints.models import Checkpoint, Tenant

    targets = spec["targets"]
    payloads = spec["payloads"]
    tenants = {t.tenant_id: Tenant.objects.get(pk=t.tenant_id) for t in targets}
    writers = {t.writer_username: get_user_model().objects.get(username=t.writer_username)
               for t in targets}
    rng = random.Random(spec.get("seed", 0))
    revision = {t.pk: t.start_revision for t in targets}

    def op() -> bool:
        t = targets[0] if len(targets) == 1 else rng.choice(targets)
        tenant = tenants[t.tenant_id]
        if len(targets) > 1:  # contended: read the current revision first
            revision[t.pk] = (Checkpoint.objects.for_tenant(tenant).filter(pk=t.pk)
                              .values_list("revision", flat=True).get())
        current = revision[t.pk]
        body = envelope(t.checkpoint_id, t.run_id, current + 1,
                        payload_at(payloads, current + 1))
        env = services.parse_envelope(body, url_id=t.checkpoint_id)
        try:
            services.checkpoint_put(actor=writers[t.writer_username], tenant=tenant,
                                    envelope=env, expected_revision=current)
        except StaleRevision:
            return False
        revision[t.pk] = current + 1
        return True

    return op


def keep_alive_store(base_url: str, tenant: str, token: str):
    """``HttpCheckpointStore`` over one persistent HTTP/1.1 connection (the stock client
    opens a new connection per request through ``urllib``)."""
    from recovery_client import client

    class KeepAliveStore(client.HttpCheckpointStore):
        def __init__(self):
            super().__init__(base_url, tenant, token)
            parts = urlsplit(self.base_url)
            self._host, self._port = parts.hostname, parts.port or 80
            self._conn: http.client.HTTPConnection | None = None

        def request(self, method, path, body=None, headers=None, query=None):
            parts = urlsplit(self._url(path, query))
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            data = None
            all_headers = {"Authorization": f"Bearer {self.token}",
                           "Accept": "application/json"}
            if body is not None:
                data = json.dumps(body, allow_nan=False).encode("utf-8")
                all_headers["Content-Type"] = "application/json"
            all_headers.update(headers or {})
            for attempt in (1, 2):
                reused = self._conn is not None
                conn = self._conn or http.client.HTTPConnection(self._host, self._port,
                                                                timeout=self.timeout_s)
                try:
                    conn.request(method, target, body=data, headers=all_headers)
                    resp = conn.getresponse()
                    raw = resp.read()
                except (http.client.RemoteDisconnected, BrokenPipeError,
                        ConnectionResetError) as exc:
                    conn.close()
                    self._conn = None
                    if reused and attempt == 1:  # the server closed an idle connection
                        continue
                    raise client.CheckpointError(client.STORAGE, f"{method} {path}: {exc}") \
                        from None
                except OSError as exc:
                    conn.close()
                    self._conn = None
                    raise client.CheckpointError(client.STORAGE, f"{method} {path}: {exc}") \
                        from None
                break
            self._conn = None if resp.will_close else conn
            if resp.will_close:
                conn.close()
            answer = json.loads(raw) if raw else None
            if 200 <= resp.status < 300:
                return resp.status, dict(resp.headers), answer
            answer = answer if isinstance(answer, dict) else {}
            raise client.CheckpointError(
                client.kind_for_status(resp.status),
                f"{method} {path}: HTTP {resp.status} {answer.get('detail', '')}",
                status=resp.status, body=answer)

    return KeepAliveStore()


def make_http(spec: dict):
    (t,) = spec["targets"]
    store = keep_alive_store(spec["base_url"], t.tenant_slug, spec["token"])
    payloads = spec["payloads"]
    state = {"rev": t.start_revision}

    def op() -> bool:
        current = state["rev"]
        body = envelope(t.checkpoint_id, t.run_id, current + 1,
                        payload_at(payloads, current + 1))
        store.compare_and_swap(body, current)
        state["rev"] = current + 1
        return True

    return op


def make_langgraph(spec: dict):
    import psycopg
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    conn = psycopg.connect(spec["dsn"], autocommit=True, prepare_threshold=0,
                           row_factory=dict_row)
    saver = PostgresSaver(conn)
    thread = spec["thread_id"]
    payloads = spec["payloads"]
    state = {"step": 0, "parent": None, "version": None}

    def op() -> bool:
        step = state["step"] + 1
        version = saver.get_next_version(state["version"], None)
        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=step))
        cp["channel_values"] = {"state": payloads[step % len(payloads)]}
        cp["channel_versions"] = {"state": version}
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        if state["parent"]:
            config["configurable"]["checkpoint_id"] = state["parent"]
        saver.put(config, cp, {"source": "loop", "step": step, "parents": {}},
                  {"state": version})
        state.update(step=step, parent=cp["id"], version=version)
        return True

    return op


# --------------------------------------------------------------------------------------
# Checks (in the parent, after the writers exited)
# --------------------------------------------------------------------------------------


def check_targets(targets: list[Target], accepted: int, refused: int, *,
                  conflicts_expected: bool = False) -> dict:
    """No lost update: revisions gained == writes accepted, one history row per revision;
    with ``conflicts_expected`` every refusal left a stale-revision ``Conflict`` row."""
    from checkpoints.models import Checkpoint, CheckpointRevision, Conflict, Tenant

    problems = []
    gained = 0
    for t in targets:
        tenant = Tenant.objects.get(pk=t.tenant_id)
        final = Checkpoint.objects.for_tenant(tenant).get(pk=t.pk).revision
        gained += final - t.start_revision
        history = CheckpointRevision.objects.for_tenant(tenant).filter(checkpoint_id=t.pk)
        if history.count() != final + 1:
            problems.append(f"{t.checkpoint_id}: {history.count()} history rows for "
                            f"revision {final}")
        t.start_revision = final
    if gained != accepted:
        problems.append(f"revisions gained {gained} != writes accepted {accepted} "
                        f"(lost update)")
    conflicts = None
    if conflicts_expected:
        tenant_ids = {t.tenant_id for t in targets}
        conflicts = Conflict.objects.for_tenant(list(tenant_ids)).filter(
            target_uuid__in=[t.checkpoint_id for t in targets],
            reason="stale_revision").count()
        if conflicts != refused:
            problems.append(f"{refused} refusals but {conflicts} conflict rows")
    elif refused:
        problems.append(f"{refused} refusals in an uncontended scenario")
    return {"ok": not problems, "detail": "; ".join(problems) or (
        f"{accepted:,} accepted = revisions gained"
        + (f", {refused:,} refused = {conflicts:,} conflict rows" if conflicts_expected
           else ""))}


def check_langgraph(dsn: str, threads: list[str], accepted: int) -> dict:
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ANY(%s)",
                            [threads]).fetchone()[0]
    ok = rows == accepted
    return {"ok": ok, "detail": f"{rows:,} checkpoint rows for {accepted:,} puts"}


# --------------------------------------------------------------------------------------
# The scenarios
# --------------------------------------------------------------------------------------


def start_gunicorn(env: dict, log_path, app: str = "recovery.wsgi") -> tuple[subprocess.Popen, str]:
    """gunicorn serving ``app`` with the project's ``gunicorn.conf.py`` (read from the
    project's root, the working directory), once ``/readyz`` answers 200."""
    port = free_port()
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", app, "--bind", f"127.0.0.1:{port}",
         *GUNICORN_ARGS],
        cwd=ROOT, env=env, stdout=log, stderr=log)
    wait_for_port(port, proc)
    wait_until_ready(f"http://127.0.0.1:{port}", proc)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Scenario:
    """One row of the table: ``prepare()`` makes a round's fresh checkpoints and returns
    ``(specs, check)``: one spec per writer process, and the check of the round's row."""

    name: str
    variant: str
    writers: int
    make_op: object
    prepare: object
    tenants: int = 1
    contended: bool = False
    note: str = ""
    rounds: list = field(default_factory=list)
    #: The group ``--write-scenarios`` selects it by (``GROUPS``).
    group: str = ""


#: Groups of write scenarios, for ``python -m bench --write-scenarios`` (comma-separated):
#: each issue-22 target needs its own group and the raw reference (``raw``, always run).
GROUPS = ("raw", "orm", "services", "tenants", "http", "floor", "langgraph", "contended")


def run_all(*, dsn: str, env: dict, warmup: float, seconds: float, rounds: int, log_dir,
            say, groups: set[str] | None = None) -> list[dict]:
    """Every write scenario (of ``groups``, default all of ``GROUPS``; the raw reference
    always), ``rounds`` times in turn, interleaved: each round runs every scenario once,
    so a product row and its reference share the round's state of the machine and of its
    disk's commit flush (issue 22: that flush alternates between about 0.3 ms and 4 ms
    here and changes every ratio). Every round is checked and kept in ``rounds``, with
    its ``round`` number; the row's headline figures are its median round (the report
    compares rounds, ``bench.report``)."""
    groups = set(GROUPS) if not groups else set(groups) | {"raw"}
    from django.db import connections

    from bench.common import payloads as make_payloads

    fx = Fixture()
    fx.payloads = make_payloads()
    fx.tenant("bench-w")
    pl = fx.payloads

    def one_each(n: int, slugs: list[str]) -> list[Target]:
        return [fx.checkpoint(slugs[i % len(slugs)]) for i in range(n)]

    def own(n: int, slugs: list[str], spec):
        def prepare():
            targets = one_each(n, slugs)
            return ([spec(t) for t in targets],
                    lambda r: check_targets(targets, r["accepted"], r["refused"]))
        return prepare

    scenarios: list[Scenario] = []
    for n in (1, 4):
        scenarios.append(Scenario(f"raw CAS+history, {n}w", "raw", n, make_raw, own(
            n, ["bench-w"], lambda t: {"dsn": dsn, "targets": [t], "payloads": pl}),
            group="raw"))
    for n in (1, 4):
        scenarios.append(Scenario(f"Django ORM, {n}w", "orm", n, make_orm, own(
            n, ["bench-w"], lambda t: {"targets": [t], "payloads": pl,
                                       "writer_id": fx.writers["bench-w"].pk}), group="orm"))
    for n in (1, 4):
        scenarios.append(Scenario(
            f"services.checkpoint_put, {n}w", "services", n, make_services,
            own(n, ["bench-w"], lambda t: {"targets": [t], "payloads": pl}),
            note="one tenant" if n > 1 else "", group="services"))
    for n in (4, 16):  # the per-tenant bottleneck: n writers in one tenant, then in n
        scenarios.append(Scenario(
            f"services.checkpoint_put, {n}w in 1 tenant", "services-tenant", n, make_services,
            own(n, ["bench-w"], lambda t: {"targets": [t], "payloads": pl}),
            note="one tenant", group="tenants"))
        scenarios.append(Scenario(
            f"services.checkpoint_put, {n}w in {n} tenants", "services-tenant", n,
            make_services,
            own(n, [f"bench-t{i}" for i in range(n)], lambda t: {"targets": [t], "payloads": pl}),
            tenants=n, note="one tenant per writer", group="tenants"))
    server = floor = None
    urls = {"product": "", "floor": ""}
    floor_slug = "bench-f"
    for n in (1, 4):
        scenarios.append(Scenario(
            f"HTTP PUT (gunicorn, keep-alive), {n}w", "http", n, make_http,
            own(n, ["bench-w"], lambda t: {"base_url": urls["product"],
                                           "token": fx.tokens["bench-w"],
                                           "targets": [t], "payloads": pl}),
            note=f"{n} client process(es), gunicorn.conf.py", group="http"))
        scenarios.append(Scenario(
            f"HTTP floor: bare WSGI app (gunicorn), {n}w", "floor", n, make_http,
            own(n, [floor_slug], lambda t: {"base_url": urls["floor"],
                                            "token": fx.tokens[floor_slug],
                                            "targets": [t], "payloads": pl}),
            note="bench/floor_wsgi.py: token, JSON, encryption, one CAS+history",
            group="floor"))
    skipped = None
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError as exc:
        skipped = f"langgraph-checkpoint-postgres does not import: {exc}"
    else:
        from bench import bench_langgraph as lg

        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
        lg_slug = "bench-lg"
        fx.tenant(lg_slug)
        for n in (1, 4):
            def prepare_pg(n=n):
                threads = [f"bench-thread-{uuid.uuid4()}" for _ in range(n)]
                return ([{"dsn": dsn, "thread_id": th, "payloads": pl} for th in threads],
                        lambda r: check_langgraph(dsn, threads, r["accepted"]))

            def prepare_rs(n=n):
                threads = [f"bench-thread-{uuid.uuid4()}" for _ in range(n)]
                tenant = fx.tenants[lg_slug]
                return ([{"base_url": urls["product"], "tenant": lg_slug,
                          "token": fx.tokens[lg_slug], "thread_id": th, "payloads": pl}
                         for th in threads],
                        lambda r: lg.check_recovery(threads, r["accepted"], tenant))
            scenarios.append(Scenario(f"LangGraph PostgresSaver.put, {n}w", "langgraph", n,
                                      lg.make_postgres_put, prepare_pg,
                                      note="append-only, no CAS", group="langgraph"))
            scenarios.append(Scenario(f"RecoverySaver.put (HTTP), {n}w", "recoverysaver", n,
                                      lg.make_recovery_put, prepare_rs,
                                      note="through gunicorn, one httpx client",
                                      group="langgraph"))

    def contended_raw():
        targets = one_each(10, ["bench-c"])
        return ([{"dsn": dsn, "targets": targets, "payloads": pl, "seed": i}
                 for i in range(16)], lambda r: _contended_raw_check(targets, r))

    def contended_services():
        targets = one_each(10, ["bench-s"])
        return ([{"targets": targets, "payloads": pl, "seed": i} for i in range(16)],
                lambda r: check_targets(targets, r["accepted"], r["refused"],
                                        conflicts_expected=True))

    scenarios.append(Scenario("raw CAS contended, 16w on 10", "raw", 16, make_raw,
                              contended_raw, contended=True, group="contended"))
    scenarios.append(Scenario("services contended, 16w on 10", "services", 16, make_services,
                              contended_services, contended=True,
                              note="each refusal is a Conflict row, run state, audit event",
                              group="contended"))
    scenarios = [sc for sc in scenarios if sc.group in groups]

    try:
        if groups & {"http", "langgraph"}:
            server, urls["product"] = start_gunicorn(env, log_dir / "gunicorn.log")
            # one request first: the workers' imports and connections outside the timing
            for _ in range(4):
                keep_alive_store(urls["product"], "bench-w",
                                 fx.tokens["bench-w"]).request("GET", "report")
        if "floor" in groups:
            fx.tenant(floor_slug)
            floor, urls["floor"] = start_gunicorn(env, log_dir / "gunicorn-floor.log",
                                                  app="bench.floor_wsgi:app")
        for r in range(1, rounds + 1):
            say(f"  round {r} of {rounds}")
            for sc in scenarios:
                specs, check = sc.prepare()
                outcomes = run_writers(sc.make_op, specs, warmup=warmup, seconds=seconds)
                row = summarise(outcomes)
                connections.close_all()
                if row["errors"]:
                    row["check"] = {"ok": False, "detail": "writer failed: "
                                    + row["errors"][0].strip().splitlines()[-1]}
                else:
                    row["check"] = check(row)
                row["round"] = r
                sc.rounds.append(row)
                say(f"    {sc.name:<42} {row['ops_per_s']:>8,.0f} ops/s  p50 "
                    f"{row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                    f"{'ok' if row['check']['ok'] else 'FAILED'}: {row['check']['detail']}")
    finally:
        for proc in (server, floor):
            if proc is not None:
                stop(proc)

    results: list[dict] = []
    for sc in scenarios:
        median = sorted(sc.rounds, key=lambda x: x["ops_per_s"])[(len(sc.rounds) - 1) // 2]
        ok = all(x["check"]["ok"] for x in sc.rounds)
        check = {"ok": ok, "detail": median["check"]["detail"] if ok else next(
            x["check"]["detail"] for x in sc.rounds if not x["check"]["ok"])}
        results.append({"scenario": sc.name, "variant": sc.variant, "writers": sc.writers,
                        "tenants": sc.tenants, "contended": sc.contended, "note": sc.note,
                        "group": sc.group,
                        **{k: v for k, v in median.items() if k not in ("check", "round")},
                        "check": check, "rounds": sc.rounds})
    if skipped:
        say(f"  LangGraph PostgresSaver.put: skipped: {skipped}")
        results.append({"scenario": "LangGraph PostgresSaver.put", "variant": "langgraph",
                        "skipped": skipped})
    return results


def _contended_raw_check(targets: list[Target], row: dict) -> dict:
    """Raw contended: no lost update (revisions gained == wins); refusals leave no row
    (the reference records nothing), so they are only counted."""
    result = check_targets(targets, row["accepted"], 0)
    if result["ok"]:
        result["detail"] += f", {row['refused']:,} refused (not recorded by the reference)"
    return result
