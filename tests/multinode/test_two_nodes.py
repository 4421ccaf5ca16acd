"""docs/scaling.md "Two nodes on one machine", started and used as a black box (issue 22,
item 4): a PostgreSQL primary, a streaming replica of it (``pg_basebackup``), PgBouncer in transaction pooling mode (Debian's 1.18: no
server-side prepared statements), two gunicorn nodes through PgBouncer (the client
alternates between them), two Celery workers and one beat on Redis.

Over HTTP only (set-up and the final audit check by ``manage.py``, as an operator does):
- the replica serves the run list: with its replay paused a new run is on the run page
  (primary) and not in the list; replay resumed, it is; ``/readyz`` names the replica
  and its lag, ``/metrics`` serves the lag;
- a compare-and-swap race across the two nodes: one write wins, the other gets 412;
- a crash (the runtime's lease runs out with a charge submitted), a reconcile by a
  reviewer (a worker looks the charge up: never executed), a retry requested by the
  reviewer and approved by another person (not by the requester), and the runtime's
  resume gets ``retry`` with a new fencing token;
- 60 s of writers through both nodes, during which one node and one worker are SIGKILLed
  and restarted: every write answered 2xx is readable at its revision with its payload
  afterwards, and ``verify_audit_chain`` passes.

The PostgreSQL primary is a cluster of the test's own (``initdb``, a free port, in a
temporary directory), so the replica's copy is small and nothing the rest of the suite
does on the main cluster reaches it. Slow (about 3 minutes); in ``make test``'s
PostgreSQL pass (``postgres``). Needs PostgreSQL's server binaries, pgbouncer and Redis
(``MULTINODE_REDIS_URL``, default db 11): outside CI a missing piece skips saying what to
install, under CI (``CI`` set: ``.ci/run`` installs pgbouncer) it fails.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.faults.stubs import StatusStub
from tests.multinode import cluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(600)]

PASSWORD = "multinode-test-pw-5523"
LOAD_S = int(os.environ.get("MULTINODE_LOAD_S", "60"))
WRITERS = 4
REDIS_URL = os.environ.get("MULTINODE_REDIS_URL", "redis://127.0.0.1:6379/11")
TENANT = "acme"


def _missing(why: str):
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{why}; under CI it must be there (.ci/run)")
    pytest.skip(why)


# --- HTTP --------------------------------------------------------------------------------

class Http:
    """Keep-alive HTTP to the nodes; ``request`` picks the node (alternating when not
    given). A connection error comes back as status 0 (the request may or may not have
    been acted on: the caller finds out)."""

    def __init__(self, nodes: list[int], token: str):
        self.nodes, self.token = nodes, token
        self.conns: dict[int, http.client.HTTPConnection] = {}
        self.turn = 0

    def request(self, method: str, path: str, body=None, node: int | None = None,
                **headers) -> tuple[int, dict, dict | None]:
        if node is None:
            node, self.turn = self.turn, (self.turn + 1) % len(self.nodes)
        port = self.nodes[node]
        headers = {"Authorization": f"Bearer {self.token}", **headers}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        conn = self.conns.get(port)
        if conn is None:
            conn = self.conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.conns.pop(port, None)
            return 0, {}, None
        if response.getheader("Connection", "").lower() == "close":
            conn.close()
            self.conns.pop(port, None)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = {"raw": raw[:500].decode(errors="replace")}
        return response.status, dict(response.getheaders()), parsed


def api(rest: str) -> str:
    return f"/api/v1/tenants/{TENANT}/{rest}"


def envelope(cid, run_id, revision, phase="ready", marker="") -> dict:
    return {"id": str(cid), "run_id": str(run_id), "revision": revision, "kind": "acme.order",
            "schema_version": 1,
            "payload": {"phase": phase, "order_id": marker or f"r{revision}"},
            "updated_at_ms": int(time.time() * 1000)}


def effect(eid, run_id, revision, state, key) -> dict:
    return {"id": str(eid), "run_id": str(run_id), "revision": revision, "operation_key": key,
            "service": "payments", "effect_class": "non_idempotent",
            "request_fingerprint": "ab" * 32, "state": state, "receipt": None}


def until(predicate, what: str, timeout: float = 60, every: float = 0.3):
    """Poll ``predicate`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


# --- the deployment ----------------------------------------------------------------------

class Deployment:
    """Everything started, with ``stop`` for teardown."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[cluster.Proc] = []
        self.nodes: list[cluster.Proc] = []
        self.workers: list[cluster.Proc] = []
        self.tokens: dict[str, str] = {}

    def add(self, proc: cluster.Proc) -> cluster.Proc:
        self.procs.append(proc)
        return proc

    def restart(self, proc: cluster.Proc) -> cluster.Proc:
        fresh = cluster.Proc(proc.name, proc.argv, proc.env, proc.log, port=proc.port,
                             popen_kw=proc.popen_kw)
        self.procs.append(fresh)
        fresh.start()
        return fresh

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="module")
def deployment():
    if not shutil.which("pgbouncer") and not os.path.exists("/usr/sbin/pgbouncer"):
        _missing("pgbouncer is missing: apt-get install -y --no-install-recommends pgbouncer")
    if not os.path.exists(cluster.pg_bin("initdb")):
        _missing("PostgreSQL's initdb is missing (/usr/lib/postgresql/*/bin)")
    import psycopg
    import redis

    broker = redis.Redis.from_url(REDIS_URL)
    try:
        broker.ping()
    except redis.RedisError:
        _missing(f"Redis is not answering at {REDIS_URL}")

    tmp = Path(tempfile.mkdtemp(prefix="recovery-multinode-"))
    user, host = "postgres", "127.0.0.1"
    dbname = f"recovery_multinode_{uuid.uuid4().hex[:10]}"
    broker.flushdb()
    stub = StatusStub().start()
    dep = Deployment(tmp)
    try:
        primary = dep.add(cluster.start_primary(tmp, user=user))
        admin = f"postgres://{user}@{host}:{primary.port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        direct = f"postgres://{user}@{host}:{primary.port}/{dbname}"
        base_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "localhost,127.0.0.1",
            "RECOVERY_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
            "RECOVERY_AUDIT_KEYS": secrets.token_urlsafe(40),
            "RECOVERY_METRICS_TOKEN": "multinode-metrics-" + "m" * 20,
            "RECOVERY_VAR_DIR": str(tmp / "var"),
            "RECOVERY_STATIC_MANIFEST": "0",
            "SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
            "DATABASE_URL": direct,
            "PYTHONUNBUFFERED": "1",
        }
        cluster.manage(base_env, "migrate", "--noinput")
        cluster.manage(base_env, "create_tenant", TENANT, "--name", "Acme Corp")
        for name, role, service in (("wendy", "writer", True), ("rita", "reviewer", False),
                                    ("april", "approver", False)):
            cluster.manage(base_env, "create_account", name, *(["--service"] if service else
                                                                ["--password-stdin"]),
                           stdin=None if service else PASSWORD + "\n")
            cluster.manage(base_env, "grant", name, role, TENANT)
            dep.tokens[name] = cluster.manage(base_env, "issue_token", name).strip()

        standby = dep.add(cluster.start_replica(tmp, host=host, port=primary.port, user=user,
                                                admin_url=admin))
        bouncer = dep.add(cluster.start_pgbouncer(tmp, dbname=dbname, host=host,
                                                  port=primary.port, user=user))
        dep.replica_url = f"postgres://{user}@{host}:{standby.port}/{dbname}"
        run_env = {
            **base_env,
            "DATABASE_URL": f"postgres://{user}@{host}:{bouncer.port}/{dbname}?pgbouncer=1",
            "RECOVERY_REPLICA_URL": dep.replica_url,
            "CELERY_BROKER_URL": REDIS_URL,
            "RECOVERY_RECONCILERS": f"payments={stub.url}",
            "RECOVERY_RECONCILE_SETTLE_DELAY_S": "0",
            "RECOVERY_SWEEP_INTERVAL_S": "2",
            "WEB_CONCURRENCY": "1", "GUNICORN_THREADS": "4",
        }
        dep.env, dep.base_env = run_env, base_env
        for i in range(2):
            dep.workers.append(dep.add(cluster.celery_worker(f"worker{i}", run_env, tmp)))
            dep.workers[-1].start()
        dep.add(cluster.celery_beat(run_env, tmp)).start()
        for i in range(2):
            dep.nodes.append(dep.add(cluster.gunicorn(f"node{i}", run_env, tmp)).start())
        for worker in dep.workers:
            cluster.wait_log(worker, "ready.")
        yield dep
    finally:
        dep.stop()  # the primary last
        stub.stop()
        broker.flushdb()
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)


def client(dep: Deployment, who: str) -> Http:
    return Http([n.port for n in dep.nodes], dep.tokens[who])


def create_run(http: Http, phase: str = "ready", node: int | None = None):
    cid, run_id = uuid.uuid4(), uuid.uuid4()
    status, headers, body = http.request("PUT", api(f"checkpoints/{cid}"),
                                         envelope(cid, run_id, 0, phase), node=node,
                                         **{"If-None-Match": "*"})
    assert status == 201, body
    return cid, run_id


# --- the flows ---------------------------------------------------------------------------

def test_the_replica_serves_the_run_list_and_its_lag_is_shown(deployment):
    dep = deployment
    wendy = client(dep, "wendy")
    import psycopg

    listed = lambda run_id: any(  # noqa: E731
        r["run_id"] == str(run_id) for r in
        (wendy.request("GET", api("runs?limit=100"))[2] or {}).get("results", []))
    _, first = create_run(wendy)
    until(lambda: listed(first), "the run list (replica) to show a new run")

    with psycopg.connect(dep.replica_url, autocommit=True) as replica:
        replica.execute("SELECT pg_wal_replay_pause()")
        try:
            _, hidden = create_run(wendy)
            # The run page reads the primary; the list reads the paused replica.
            for node in (0, 1):
                status, _, body = wendy.request("GET", api(f"runs/{hidden}"), node=node)
                assert status == 200, body
                assert not listed(hidden)
        finally:
            replica.execute("SELECT pg_wal_replay_resume()")
    until(lambda: listed(hidden), "the run list to show the run once replay resumed")

    # Ready once beat's first sweep ran on a worker (the worker check).
    ready = until(lambda: (lambda a: a[0] == 200 and a[2])(wendy.request("GET", "/readyz")),
                  "/readyz to be 200")
    assert ready["checks"]["replica"] == "ok" and ready["checks"]["broker"] == "ok"
    assert isinstance(ready["replica_lag_s"], float | int)
    conn = http.client.HTTPConnection("127.0.0.1", dep.nodes[0].port, timeout=30)
    conn.request("GET", "/metrics",
                 headers={"Authorization": f"Bearer {dep.env['RECOVERY_METRICS_TOKEN']}"})
    text = conn.getresponse().read().decode()
    conn.close()
    assert "recovery_replica_up 1.0" in text
    assert "recovery_replica_lag_seconds " in text


def test_a_compare_and_swap_race_across_the_two_nodes_has_one_winner(deployment):
    wendy_a, wendy_b = client(deployment, "wendy"), client(deployment, "wendy")
    cid, run_id = create_run(wendy_a)
    barrier = threading.Barrier(2)
    answers: dict[int, tuple] = {}

    def write(node: int, http: Http) -> None:
        body = envelope(cid, run_id, 1, marker=f"node{node}")
        barrier.wait()
        answers[node] = http.request("PUT", api(f"checkpoints/{cid}"), body, node=node,
                                     **{"If-Match": '"0"'})

    threads = [threading.Thread(target=write, args=(n, h))
               for n, h in ((0, wendy_a), (1, wendy_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    statuses = sorted(a[0] for a in answers.values())
    assert statuses == [200, 412], answers
    loser = next(a for a in answers.values() if a[0] == 412)
    assert loser[2] == {"error": "conflict", "current_revision": 1}
    winner = next(n for n, a in answers.items() if a[0] == 200)
    for node in (0, 1):
        status, headers, body = wendy_a.request("GET", api(f"checkpoints/{cid}"), node=node)
        assert (status, headers.get("ETag"), body["payload"]["order_id"]) == \
            (200, '"1"', f"node{winner}")
    # The refused write is kept: the run is conflicted (the run page reads the primary).
    status, _, run = wendy_a.request("GET", api(f"runs/{run_id}"))
    assert run["run"]["recovery_state"] == "conflicted", run


def test_crash_reconcile_approve_and_resume_across_nodes_and_workers(deployment):
    dep = deployment
    wendy, rita, april = (client(dep, w) for w in ("wendy", "rita", "april"))
    cid, run_id = create_run(wendy, phase="charging")
    status, _, lease = wendy.request("POST", api(f"runs/{run_id}/lease"),
                                     {"owner": "runtime-1", "ttl_s": 1})
    assert status == 200, lease
    token = str(lease["fencing_token"])
    eid, key = uuid.uuid4(), f"charge:{uuid.uuid4().hex[:8]}"
    assert wendy.request("PUT", api(f"effects/{eid}"), effect(eid, run_id, 0, "planned", key),
                         **{"If-None-Match": "*", "Fencing-Token": token})[0] == 201
    assert wendy.request("PUT", api(f"effects/{eid}"),
                         effect(eid, run_id, 1, "submitted", key),
                         **{"If-Match": '"0"', "Fencing-Token": token})[0] == 200
    # The runtime dies here. Its lease runs out (database clock); a reviewer reconciles.
    reason = {"reason": "runtime died after submitting the charge"}

    def reconciled():
        status, _, body = rita.request("POST", api(f"runs/{run_id}/reconcile"), reason)
        assert status in (202, 409), body
        return status == 202 and body

    until(reconciled, "the reconcile to be accepted (lease expired)", timeout=30)
    until(lambda: (rita.request("GET", api(f"effects/{eid}"))[2] or {}).get("state")
          == "not_executed", "a worker to settle the charge (never executed)")

    status, _, retry = rita.request("POST", api(f"runs/{run_id}/retry-requests"),
                                    {"reason": "the charge never happened: retry it"})
    assert status == 201, retry
    # Two people: the requester may not approve her own request.
    status, _, body = rita.request("POST", api(f"retry-requests/{retry['id']}/approve"),
                                   {"reason": "mine"})
    assert status == 403, body
    status, _, body = april.request("POST", api(f"retry-requests/{retry['id']}/approve"),
                                    {"reason": "checked with the provider"})
    assert status == 200 and body["state"] == "approved", body

    status, _, decision = wendy.request("POST", api(f"runs/{run_id}/resume"), {})
    assert status == 200, decision
    assert decision["action"] == "retry" and decision["fencing_token"] > int(token), decision
    # The old owner's token is fenced off now, on either node.
    status, _, body = wendy.request("PUT", api(f"checkpoints/{cid}"),
                                    envelope(cid, run_id, 1, "charging"),
                                    **{"If-Match": '"0"', "Fencing-Token": token})
    assert (status, body.get("error")) == (409, "fenced"), body


def test_a_node_and_a_worker_killed_under_load_lose_no_acknowledged_write(deployment):
    dep = deployment
    acked: list[tuple[str, int, str]] = []  # (checkpoint id, revision, order_id)
    stats = {"ok": 0, "refused": 0, "failed": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        http = client(dep, "wendy")
        cid, run_id = create_run(http)
        revision = 0
        while not stop.is_set():
            marker = f"w{w}-{revision + 1}-{uuid.uuid4().hex[:6]}"
            status, _, body = http.request("PUT", api(f"checkpoints/{cid}"),
                                           envelope(cid, run_id, revision + 1, marker=marker),
                                           **{"If-Match": f'"{revision}"'})
            with lock:
                if status == 200:
                    acked.append((str(cid), revision + 1, marker))
                    stats["ok"] += 1
                elif status == 412:
                    stats["refused"] += 1
                else:
                    stats["failed"] += 1
            if status == 200:
                revision += 1
            elif status:
                assert status in (412, 502, 503), body
            if status != 200:  # unknown or refused: read where it stands, on any node
                for _ in range(100):
                    s, headers, _ = http.request("GET", api(f"checkpoints/{cid}"))
                    if s == 200:
                        revision = int(headers["ETag"].strip('"'))
                        break
                    time.sleep(0.1)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(LOAD_S / 3)
    dep.nodes[1].kill()
    dep.workers[1].kill()
    time.sleep(5)
    dep.nodes[1] = dep.restart(dep.nodes[1])
    dep.workers[1] = dep.restart(dep.workers[1])
    while time.monotonic() - started < LOAD_S:
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - started
    print(f"\nload: {stats['ok']} writes acknowledged in {elapsed:.0f} s "
          f"({stats['ok'] / elapsed:.0f}/s), {stats['failed']} failed (the killed node), "
          f"{stats['refused']} refused")
    assert stats["ok"] > 0 and stats["failed"] > 0  # the kill happened during the load

    # Every acknowledged write is readable at its revision with its payload.
    reader = client(dep, "wendy")
    by_checkpoint: dict[str, dict[int, str]] = {}
    for cid, revision, marker in acked:
        by_checkpoint.setdefault(cid, {})[revision] = marker
    for cid, expected in by_checkpoint.items():
        stored: dict[int, str] = {}
        cursor = None
        while True:
            path = api(f"checkpoints/{cid}/revisions?limit=100"
                       + (f"&cursor={cursor}" if cursor is not None else ""))
            status, _, page = reader.request("GET", path)
            assert status == 200, page
            for env in page["results"]:
                stored[env["revision"]] = env["payload"]["order_id"]
            if not page["next"]:
                break
            cursor = page["results"][-1]["revision"]
        lost = {r: m for r, m in expected.items() if stored.get(r) != m}
        assert not lost, f"{cid}: acknowledged but not stored as acknowledged: {lost}"

    # Both nodes ready again (the restarted worker and beat sweep), the audit intact.
    for node in (0, 1):
        until(lambda n=node: reader.request("GET", "/readyz", node=n)[0] == 200,
              f"node{node} ready after the kills", timeout=60)
    cluster.manage(dep.base_env, "verify_audit_chain")
