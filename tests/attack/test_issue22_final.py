"""Final attack on issue 22's change (``git diff 3991d78``): one input of each fault kind
the team has seen, across the whole change and mostly where the two earlier attacks
(``test_issue22_lgput.py``, ``test_issue22_lgwrites.py``: the LangGraph SQL paths against
the ORM path, exhaustively) did not look: the LangGraph endpoints' HTTP surface, the
replica's health rule, the error wrapper, the merkle CLI.

Each test names its fault kind (``kind N``) and says pass or finding. The LangGraph tests
run on PostgreSQL outside a transaction (``transaction=True``), so the fast paths
(``_put_sql``, ``_writes_sql``) really run; the ``fast`` fixture records that they did.
"""

from __future__ import annotations

import inspect
import json
import re
from datetime import UTC, datetime

import pytest
from django.db import InterfaceError, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints import audittree, replica, sql
from checkpoints.interop.langgraph import put as put_module
from checkpoints.interop.langgraph import writes as writes_module
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    GraphCheckpoint,
    GraphWrite,
    Run,
)
from recovery_client.protocol import thread_checkpoint_id, thread_run_id
from tests.api.apihelpers import snapshot, url
from tests.helpers import lg_put, lg_writes

LG = "langgraph/"
SECRET = "card-4242-4242-4242"
WRITE_SQL = re.compile(r"^\s*(WITH\b.*\b(INSERT|UPDATE|DELETE)\b|INSERT|UPDATE|DELETE)",
                       re.IGNORECASE | re.DOTALL)

pg = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def cid(i: int) -> str:
    return f"1f0c3a2e-{i:04x}-6000-8000-000000000000"


def put(client, body, tenant="acme", token=None, **extra):
    if token is not None:
        extra["HTTP_FENCING_TOKEN"] = str(token)
    return client.post(url(tenant, LG + "checkpoints"), data=json.dumps(body),
                       content_type="application/json", **extra)


def writes(client, body, tenant="acme", raw=None, **extra):
    data = raw if raw is not None else json.dumps(body)
    return client.post(url(tenant, LG + "writes"), data=data,
                       content_type="application/json", **extra)


def lg_get(client, query="", tenant="acme", **extra):
    return client.get(url(tenant, LG + "checkpoints") + (f"?{query}" if query else ""),
                      **extra)


def written() -> dict:
    return dict(snapshot(), graph=GraphCheckpoint.objects.count(),
                writes=GraphWrite.objects.count())


@pytest.fixture
def fast(monkeypatch, settings):
    """The SQL paths on, each call recorded: ``[(name, wrote)]``."""
    settings.RECOVERY_SQL_WRITE_PATH = True
    seen: list[tuple[str, bool]] = []
    for module, name in ((put_module, "_put_sql"), (writes_module, "_writes_sql")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            answer = _real(*args, **kwargs)
            seen.append((_name, answer is not sql.FALLBACK))
            return answer

        monkeypatch.setattr(module, name, spy)
    return seen


@pytest.fixture
def writer(api_as, wendy):
    return api_as(wendy)


def seed(client, thread="t-1", tenant="acme", *, values=None, metadata=None):
    """Two puts (the first by the ORM path, the second by ``_put_sql``): the thread's
    head is ``cid(1)``, so the next put and writes on it take the fast paths."""
    first = put(client, lg_put(thread, cid(0), nodes=["a"], values=values,
                               metadata=metadata), tenant)
    assert first.status_code == 201, first.content
    second = put(client, lg_put(thread, cid(1), parent=cid(0), nodes=["b"], values=values,
                                metadata=metadata), tenant)
    assert second.status_code == 201, second.content


# --------------------------------------------------------------------------------------
# kind 1: outside data as strict as API bodies (PASS)
# --------------------------------------------------------------------------------------

def _hostile_writes():
    good = lg_writes("t-1", cid(1), "task-1", [(0, "out", "v")])

    def w(**change):
        return dict(good, writes=[dict(good["writes"][0], **change)])

    return [
        ("idx string", json.dumps(w(idx="0")), "writes[0].idx"),
        ("idx bool", json.dumps(w(idx=True)), "writes[0].idx"),
        ("idx float", json.dumps(w(idx=1.0)), "writes[0].idx"),
        ("idx 2^31", json.dumps(w(idx=2**31)), "writes[0].idx"),
        ("idx -2^31-1", json.dumps(w(idx=-2**31 - 1)), "writes[0].idx"),
        ("channel int", json.dumps(w(channel=5)), "writes[0].channel"),
        ("channel empty", json.dumps(w(channel="")), "writes[0].channel"),
        ("channel control", json.dumps(w(channel="a\u0085b")), "writes[0].channel"),
        ("channel surrogate", json.dumps(good).replace('"out"', '"\\ud800"'),
         "writes[0].channel"),
        ("value not typed", json.dumps(w(value="plain")), "writes[0].value"),
        ("value extra key", json.dumps(w(value={"type": "str", "b64": "", "x": 1})),
         "writes[0].value"),
        ("value bad b64", json.dumps(w(value={"type": "str", "b64": "!!"})),
         "writes[0].value.b64"),
        ("write unknown field", json.dumps(w(extra=1)), "writes[0].extra"),
        ("body unknown field", json.dumps(dict(good, hello=1)), "hello"),
        ("writes object", json.dumps(dict(good, writes={})), "writes"),
        ("writes too many", json.dumps(dict(good, writes=[
            {"idx": i, "channel": "c", "value": {"type": "str", "b64": ""}}
            for i in range(1001)])), "writes"),
        ("idx twice", json.dumps(dict(good, writes=good["writes"] * 2)), "writes[1].idx"),
        ("task_id null", json.dumps(dict(good, task_id=None)), "task_id"),
        ("task_id empty", json.dumps(dict(good, task_id="")), "task_id"),
        ("task_path int", json.dumps(dict(good, task_path=7)), "task_path"),
        ("thread NUL", json.dumps(dict(good, thread_id="t\u0000")), "thread_id"),
        ("checkpoint_id list", json.dumps(dict(good, checkpoint_id=[cid(1)])),
         "checkpoint_id"),
        ("NaN", json.dumps(good).replace('"idx": 0', '"idx": NaN'), "body"),
        ("duplicate key", json.dumps(good)[:-1] + ', "task_id": "other"}', "body"),
        ("not an object", "[]", "body"),
    ]


@pytest.mark.parametrize(("what", "raw", "field"), _hostile_writes(),
                         ids=[c[0] for c in _hostile_writes()])
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind1_hostile_put_writes_bodies_are_400_naming_the_field(fast, writer, what, raw,
                                                                  field):
    """PASS. A put_writes body through the API, with the fast path primed (the thread's
    head exists and the run is not fenced): each hostile field is a 400 naming it, the
    fast path is never entered, nothing is written."""
    seed(writer)
    before, calls = written(), len(fast)
    r = writes(writer, None, raw=raw)
    assert r.status_code == 400, (what, r.status_code, r.content)
    detail = r.json()["detail"].removeprefix("body.")  # the JSON reader's strings
    assert detail.startswith(field) or (field == "body" and r.json()["error"] ==
                                        "invalid_payload"), (what, detail)
    assert len(fast) == calls and written() == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind1_an_oversized_put_writes_body_is_413_and_writes_nothing(fast, writer, settings):
    """PASS. A body over ``RECOVERY_MAX_BODY_BYTES`` is a 413 before parsing."""
    seed(writer)
    before = written()
    big = lg_writes("t-1", cid(1), "task-1", [(0, "out", "x" * settings.RECOVERY_MAX_BODY_BYTES)])
    r = writes(writer, big)
    assert r.status_code == 413, r.content
    assert written() == before


# --------------------------------------------------------------------------------------
# kind 2: values fit their columns before any query (PASS)
# --------------------------------------------------------------------------------------

def _char_limit(model, name):
    return model._meta.get_field(name).max_length


#: Every text column a LangGraph put or put_writes fills from the body, and where the body
#: carries it. The test below fails when a model gains a text column not listed here.
PUT_COLUMNS = {  # GraphCheckpoint
    "thread_id": "thread_id",
    "checkpoint_ns": "checkpoint_ns",
    "checkpoint_id": "checkpoint.id",
    "parent_checkpoint_id": "parent_checkpoint_id",
    "lg_run_id": "metadata.run_id",
}
WRITE_COLUMNS = {  # GraphWrite
    "task_id": "task_id",
    "task_path": "task_path",
    "channel": "writes[0].channel",
}
IDENTITY_COLUMNS = ("agent", "model", "workflow", "definition_version")  # Run


def test_kind2_the_column_table_is_generated_from_the_models():
    """The table above covers every text column of the rows the fast paths insert."""
    def chars(model):
        return {f.name for f in model._meta.concrete_fields
                if f.get_internal_type() in ("CharField", "SlugField")}

    assert chars(GraphCheckpoint) == set(PUT_COLUMNS)
    assert chars(GraphWrite) == set(WRITE_COLUMNS)
    assert set(IDENTITY_COLUMNS) <= chars(Run)


def _put_body(column, value, i):
    """A put whose ``column`` holds ``value``, continuing thread ``t-<column>`` at id
    ``cid(i)`` (or ``value``/a sorting-later id for the id columns)."""
    thread = value if column == "thread_id" else f"t-{column}"
    ns = value if column == "checkpoint_ns" else ""
    body = lg_put(thread, cid(i), parent=cid(i - 1) if i else None, ns=ns)
    if column == "lg_run_id":
        body["metadata"]["run_id"] = value
    if column in IDENTITY_COLUMNS:
        body["identity"] = {column: value}
    return body


@pytest.mark.parametrize("char", ["a", "\U0001d11e"], ids=["ascii", "4-byte"])
@pytest.mark.parametrize("column", [*PUT_COLUMNS, *IDENTITY_COLUMNS])
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind2_put_values_at_and_over_their_column(fast, writer, column, char):
    """PASS. At the column's max_length (ASCII and 4-byte characters) the fast put stores
    the value whole; one character more is a 400 naming the body's field (never a 500),
    nothing written."""
    model = Run if column in IDENTITY_COLUMNS else GraphCheckpoint
    limit = _char_limit(model, column)
    field = f"identity.{column}" if column in IDENTITY_COLUMNS else PUT_COLUMNS[column]
    if column in ("checkpoint_id", "parent_checkpoint_id"):
        ids = [char * (limit - 1) + "0", char * (limit - 1) + "1", char * (limit - 1) + "2"]
        bodies = [lg_put("t-id", ids[0]), lg_put("t-id", ids[1], parent=ids[0]),
                  lg_put("t-id", ids[2], parent=ids[1])]
        over = lg_put("t-id", char * limit + "3", parent=ids[2]) if column == "checkpoint_id" \
            else lg_put("t-id", cid(9), parent=char * (limit + 1))
    else:
        value = char * limit
        bodies = [_put_body(column, value, i) for i in range(3)]
        over = _put_body(column, char * (limit + 1), 3)
    for body in bodies:
        r = put(writer, body)
        assert r.status_code == 201, (column, r.status_code, r.content)
    assert ("_put_sql", True) in fast  # the last two went through the fast path
    stored = GraphCheckpoint.objects.order_by("-id").first()
    if column in PUT_COLUMNS:
        assert len(getattr(stored, column)) == limit
    else:
        run = Run.objects.get(pk=stored.run_id)
        assert getattr(run, column) in ("", char * limit)  # the run keeps its own identity
    before = written()
    r = put(writer, over)
    assert r.status_code == 400, (column, r.status_code, r.content)
    assert r.json()["detail"].startswith(field), r.json()
    assert written() == before


@pytest.mark.parametrize("char", ["a", "\U0001d11e"], ids=["ascii", "4-byte"])
@pytest.mark.parametrize("column", [*WRITE_COLUMNS, "idx"])
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind2_put_writes_values_at_and_over_their_column(fast, writer, column, char):
    """PASS. The same for put_writes' columns through ``_writes_sql`` (``idx``: the
    IntegerField's both ends, and one past each)."""
    seed(writer)
    if column == "idx":
        at = [lg_writes("t-1", cid(1), "task-1", [(-2**31, "c", "v"), (2**31 - 1, "c", "v")])]
        over = [(lg_writes("t-1", cid(1), "task-2", [(2**31, "c", "v")]), "writes[0].idx"),
                (lg_writes("t-1", cid(1), "task-2", [(-2**31 - 1, "c", "v")]),
                 "writes[0].idx")]
    else:
        limit = _char_limit(GraphWrite, column)
        kw = {"task_id": "task-1", "task_path": "", "channel": "c"}

        def body(value, idx):
            k = dict(kw, **{column: value})
            return lg_writes("t-1", cid(1), k["task_id"], [(idx, k["channel"], "v")],
                             task_path=k["task_path"])

        at = [body(char * limit, 0)]
        over = [(body(char * (limit + 1), 1), WRITE_COLUMNS[column])]
    for b in at:
        r = writes(writer, b)
        assert r.status_code == 200, (column, r.status_code, r.content)
    assert ("_writes_sql", True) in fast
    before = written()
    for b, field in over:
        r = writes(writer, b)
        assert r.status_code == 400, (column, r.status_code, r.content)
        assert r.json()["detail"].startswith(field), r.json()
    assert written() == before


# --------------------------------------------------------------------------------------
# kind 3: query parameters validated (PASS)
# --------------------------------------------------------------------------------------

BAD_QUERIES = [
    ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=abc", "limit"),
    ("limit=1.5", "limit"), ("limit=", "limit"), ("limit=%EF%BC%91", "limit"),
    ("limit=1&limit=2", "limit"), ("thread_id=", "thread_id"),
    ("thread_id=a%00b", "thread_id"), ("thread_id=a%C2%85b", "thread_id"),
    ("thread_id=" + "a" * 257, "thread_id"), ("checkpoint_ns=" + "a" * 257, "checkpoint_ns"),
    ("checkpoint_id=", "checkpoint_id"), ("checkpoint_id=" + "a" * 129, "checkpoint_id"),
    ("before=", "before"), ("before=" + "a" * 129, "before"), ("filter=[1]", "filter"),
    ("filter=%7Bbad", "filter"), ('filter={"a":1,"a":2}', "filter"),
    ("filter=" + "%7B%22a%22%3ANaN%7D", "filter"), ("hello=1", "hello"),
    ("thread_id=%FF", None),
]


@pytest.mark.parametrize(("query", "param"), BAD_QUERIES, ids=[q for q, _ in BAD_QUERIES])
@pytest.mark.django_db
def test_kind3_the_list_get_refuses_bad_parameters_naming_them(writer, query, param):
    """PASS. Each bad query parameter of ``GET …/langgraph/checkpoints`` (and its HEAD)
    is a 400 naming it (not UTF-8: a 400), never a 500 nor an empty page."""
    for method in ("get", "head"):
        r = getattr(writer, method)(url("acme", LG + "checkpoints") + "?" + query)
        assert r.status_code == 400, (method, query, r.status_code, r.content)
        if method == "get" and param is not None:
            assert r.json()["detail"].startswith(param), r.json()


# --------------------------------------------------------------------------------------
# kind 4: the database clock (PASS)
# --------------------------------------------------------------------------------------

FAR = datetime(2001, 1, 1, tzinfo=UTC)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind4_nothing_the_fast_paths_store_follows_the_process_clock(fast, writer,
                                                                      monkeypatch):
    """PASS. The process clock patched 25 years back: a fast put and fast writes through
    the API store only database times (every datetime column of every row they wrote or
    changed is after the database time the test started)."""
    seed(writer)
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        start = cur.fetchone()[0]
    monkeypatch.setattr(timezone, "now", lambda: FAR)
    calls = len(fast)
    assert put(writer, lg_put("t-1", cid(2), parent=cid(1), nodes=["c"])).status_code == 201
    r = writes(writer, lg_writes("t-1", cid(2), "task-1", [(0, "out", "v"), (-3, "__interrupt__", "i")]))
    assert r.status_code == 200, r.content
    # Writes on a checkpoint that is no longer the head: the ORM path, audited only
    # (``langgraph.writes``), its event stamped with the lock's database time too.
    r = writes(writer, lg_writes("t-1", cid(1), "task-2", [(0, "out", "old")]))
    assert r.status_code == 200, r.content
    assert fast[calls:] == [("_put_sql", True), ("_writes_sql", True), ("_writes_sql", False)]
    assert AuditEvent.objects.filter(action="langgraph.writes").count() == 1
    late = []
    for model in (GraphCheckpoint, GraphWrite, Checkpoint, CheckpointRevision, Run, AuditEvent):
        for f in model._meta.concrete_fields:
            if f.get_internal_type() != "DateTimeField":
                continue
            for pk, value in model.objects.values_list("pk", f.attname):
                if value is not None and value < start and value.year < 2010:
                    late.append((model.__name__, pk, f.name, value))
    assert late == []
    env = Checkpoint.objects.get(uuid=thread_checkpoint_id("t-1", ""))
    assert env.updated_at_ms >= int(start.timestamp() * 1000)


# --------------------------------------------------------------------------------------
# kind 5: a GET writes nothing (PASS; the list GET's payload-read audit is by design)
# --------------------------------------------------------------------------------------

def _writes_of(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if WRITE_SQL.match(q["sql"] or "")]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind5_langgraph_gets_and_heads_write_only_the_documented_audit(fast, writer):
    """PASS. HEAD writes nothing at all; GET's only writes are the audit events of a
    payload read (documented: "payload read, audited once per thread namespace"), for
    a single thread and for the whole tenant, with and without ``checkpoint_id``."""
    seed(writer)
    writes(writer, lg_writes("t-1", cid(1), "task-1", [(0, "out", "v")]))
    before = written()
    for query in ("", "thread_id=t-1", f"thread_id=t-1&checkpoint_ns=&checkpoint_id={cid(1)}",
                  f"before={cid(1)}&limit=1", 'filter={"source":"loop"}'):
        with CaptureQueriesContext(connection) as ctx:
            r = writer.head(url("acme", LG + "checkpoints") + "?" + query)
        assert r.status_code == 200 and _writes_of(ctx) == [], query
        with CaptureQueriesContext(connection) as ctx:
            r = lg_get(writer, query)
        assert r.status_code == 200, r.content
        for statement in _writes_of(ctx):
            assert f'INTO "{AuditEvent._meta.db_table}"' in statement, statement
    after = written()
    assert after.pop("audit") >= before.pop("audit")
    assert after == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind5_readyz_with_a_replica_configured_writes_nothing(monkeypatch, client, acme):
    """PASS. ``/readyz`` with a replica configured (lagging, and healthy) runs no write
    statement on the primary."""
    monkeypatch.setattr(replica, "configured", lambda: True)
    for verdict in (replica.ReplicaLagging("lag 99 s > 30 s"), None):
        def check(v=verdict):
            if v is not None:
                raise v
        monkeypatch.setattr(replica, "replica_check", check)
        monkeypatch.setattr(replica, "lag_s", lambda: 99.0)
        before = written()
        with CaptureQueriesContext(connection) as ctx:
            r = client.get("/readyz")
        assert r.status_code in (200, 503)
        assert r.json()["checks"]["replica"] == ("ok" if verdict is None
                                                 else "failed: ReplicaLagging")
        assert _writes_of(ctx) == [] and written() == before


# --------------------------------------------------------------------------------------
# kind 6: rights only from tenant grants (PASS)
# --------------------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind6_another_tenants_writer_and_a_viewer_cannot_put_or_write(
        fast, api_as, wendy, wes, vic, rita, globex):
    """PASS. Globex's thread is primed for the fast paths; acme's writer posting a put and
    writes to globex's URL with her own token is refused (403/404), and so are acme's
    viewer and reviewer on acme's URL; nothing is written, no fast path is entered."""
    seed(api_as(wes), tenant="globex")
    seed(api_as(wendy), tenant="acme")
    before, calls = written(), len(fast)
    next_put = lg_put("t-1", cid(2), parent=cid(1))
    next_writes = lg_writes("t-1", cid(1), "task-x", [(0, "out", "v")])
    for client, tenant, allowed in ((api_as(wendy), "globex", (403, 404)),
                                    (api_as(vic), "acme", (403,)),
                                    (api_as(rita), "acme", (403,))):
        r = put(client, next_put, tenant)
        assert r.status_code in allowed, (tenant, r.status_code, r.content)
        r = writes(client, next_writes, tenant)
        assert r.status_code in allowed, (tenant, r.status_code, r.content)
    assert written() == before and len(fast) == calls


# --------------------------------------------------------------------------------------
# kind 7: background work (PASS: the change adds none; the audit events it inserts are
# the sequencer's existing work, and they integrate)
# --------------------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind7_no_new_background_work_and_the_fast_paths_events_integrate(fast, writer, acme):
    """PASS. The new code schedules nothing (no ``on_commit``, task, thread); the audit
    events its statements insert are queued for the sequencer like any other and
    integrate, and the tenant's tree verifies."""
    source = "".join(inspect.getsource(m) for m in (put_module, writes_module))
    for word in ("on_commit", ".delay(", "apply_async", "Thread(", "send_task"):
        assert word not in source, word
    seed(writer)
    assert writes(writer, lg_writes("t-1", cid(1), "task-1", [(0, "o", "v")])).status_code == 200
    assert ("_writes_sql", True) in fast and ("_put_sql", True) in fast
    assert audittree.tenant_lag(acme)["pending"] > 0  # queued, as every append
    while audittree.audit_integrate(acme):
        pass
    assert audittree.tenant_lag(acme)["pending"] == 0
    ok, _, problem = audittree.audit_verify(tenant=acme)
    assert ok, problem


# --------------------------------------------------------------------------------------
# kind 8: locks in one order (PASS)
# --------------------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind8_the_fast_paths_lock_gate_then_run_then_checkpoint(fast, writer):
    """PASS. Each fast path's first statement is ``locks.write_lock_sql`` (the gate shared,
    then the run: ``checkpoints_write_lock_v2``); no statement of theirs takes a row lock
    of its own (``FOR … UPDATE/SHARE``); the only rows they update are the locked run and
    its envelope (a run object, last in ``locks.ORDER``), after that lock."""
    seed(writer)
    from checkpoints import locks

    lock_call = locks.write_lock_sql().split("(")[0]
    for send in (lambda: put(writer, lg_put("t-1", cid(2), parent=cid(1))),
                 lambda: writes(writer, lg_writes("t-1", cid(2), "task-1", [(0, "o", "v")]))):
        calls = len(fast)
        with CaptureQueriesContext(connection) as ctx:
            r = send()
        assert r.status_code in (200, 201) and fast[calls][1], r.content
        statements = [q["sql"] for q in ctx.captured_queries]
        first = next(i for i, s in enumerate(statements) if lock_call in s)
        tail = statements[first:]
        assert not any(re.search(r"\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b|\bFOR\s+KEY\s+SHARE",
                                 s, re.I) for s in tail)
        updated = set()
        for s in tail:
            updated |= set(re.findall(r'UPDATE\s+"([a-z_]+)"', s))
        assert updated <= {Run._meta.db_table, Checkpoint._meta.db_table}, updated
        # nothing of the tenant is written before the lock
        assert not any(WRITE_SQL.match(s) for s in statements[:first]
                       if "last_used_at" not in s)


# --------------------------------------------------------------------------------------
# kind 9: health checks tell the truth (FINDING: an unexpected error of the replica's
# check is a 500 on the pages it serves, while /readyz reports it as a failed check)
# --------------------------------------------------------------------------------------

@pytest.fixture
def replica_on(monkeypatch):
    """A replica configured, its check controlled by the test (``verdict[0]``: None
    passes, an exception is raised), the check's state reset."""
    monkeypatch.setattr(replica, "configured", lambda: True)
    monkeypatch.setattr(replica, "_down_until", [0.0])
    monkeypatch.setattr(replica, "_good_until", [0.0])
    verdict = [None]

    def check():
        if verdict[0] is not None:
            raise verdict[0]

    monkeypatch.setattr(replica, "replica_check", check)
    monkeypatch.setattr(replica, "lag_s", lambda: 99.0)
    return verdict


@pytest.mark.django_db(transaction=True)
def test_kind9_a_lagging_replica_degrades_readyz_while_reads_fall_back(replica_on, client,
                                                                       api_as, rita):
    """PASS. Lagging: ``/readyz`` names the replica as failed and the node as
    ``degraded`` (200: it serves from the primary, so the balancer keeps it; stop 36,
    ``ops.health.DEGRADING``), and the API's run list (a replica read) answers from the
    primary (the replica alias does not even exist here: reading it would fail). Outside
    a transaction, as a request runs (inside one the router never picks the replica)."""
    replica_on[0] = replica.ReplicaLagging("lag 99.0 s > 30 s")
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"]["replica"] == "failed: ReplicaLagging"
    assert r.json()["status"] == "degraded" and r.json()["degraded"] == ["replica"]
    r = api_as(rita).get(url("acme", "runs"))
    assert r.status_code == 200, r.content
    assert replica._down_until[0] > 0.0  # the block checked the replica and left it
    assert replica.read_alias() == "default"


@pytest.mark.parametrize("error", [InterfaceError("connection already closed"),
                                   RuntimeError("unexpected")],
                         ids=["InterfaceError", "RuntimeError"])
@pytest.mark.django_db(transaction=True)
def test_kind9_an_unexpected_replica_check_error_is_not_a_500(replica_on, client, api_as,
                                                             rita, error):
    """FINDING (checkpoints/replica.py ``_recheck``: ``except (DatabaseError,
    ReplicaBroken, ReplicaLagging)``). ``/readyz`` counts any exception of
    ``replica_check`` as a failed check (503, ``failed: InterfaceError``), but the reads
    the replica serves re-raise anything else: Django's ``InterfaceError`` (psycopg's
    "connection already closed", which is not a ``DatabaseError``) made every replica
    read fail (the API's run list: 503 "database unavailable" although the primary
    answers; any other class: 500), as would the inbox and the report. The replica must
    then be left alone, as for a lag, and the read served by the primary."""
    replica_on[0] = error
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "degraded"  # stop 36: degrades
    assert r.json()["checks"]["replica"] == f"failed: {type(error).__name__}"
    api = api_as(rita)
    api.raise_request_exception = False
    r = api.get(url("acme", "runs"))
    assert r.status_code == 200, r.status_code


# --------------------------------------------------------------------------------------
# kind 10: Vary: HX-Request (PASS: nothing in the change depends on HX-Request)
# --------------------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind10_langgraph_answers_do_not_depend_on_hx_request(fast, writer):
    """PASS. The change adds no response that reads ``HX-Request`` (no occurrence in the
    changed modules); the LangGraph endpoints answer the same with and without it."""
    for module in (put_module, writes_module, replica, sql):
        assert "HX-Request" not in inspect.getsource(module)
        assert "htmx" not in inspect.getsource(module).lower()
    seed(writer)
    body = lg_put("t-1", cid(1), parent=cid(0), nodes=["b"])
    plain, hx = put(writer, body), put(writer, body, HTTP_HX_REQUEST="true")
    assert (plain.status_code, plain.json()) == (hx.status_code, hx.json()) == (
        200, plain.json())
    a, b = lg_get(writer, "thread_id=t-1"), lg_get(writer, "thread_id=t-1", HTTP_HX_REQUEST="true")
    assert a.status_code == b.status_code == 200 and a.json() == b.json()
    assert "HX-Request" not in a.get("Vary", "")


# --------------------------------------------------------------------------------------
# kind 11: the API hides what the dashboard hides (PASS)
# --------------------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_kind11_no_channel_write_or_metadata_value_in_what_the_api_shows(
        fast, api_as, wendy, vic, rita):
    """PASS. The dashboard shows a LangGraph run's summary and never a channel value, a
    write's value or a metadata value but ``step``/``source`` (tests/views/
    test_langgraph_pages.py). Written by the fast paths, the envelope a reviewer reveals
    through the API, its revisions, the run, the run list and the audit events carry
    none of them either; a viewer may not read the envelope at all (403), as the
    dashboard shows a viewer no payload."""
    writer = api_as(wendy)
    seed(writer, values={"card": SECRET}, metadata={"source": "loop", "step": 1,
                                                  "note": SECRET})
    r = writes(writer, lg_writes("t-1", cid(1), "task-1", [(0, "sent", SECRET)],
                                 task_path=SECRET))
    assert r.status_code == 200
    assert ("_writes_sql", True) in fast and ("_put_sql", True) in fast
    env, run = thread_checkpoint_id("t-1", ""), thread_run_id("t-1")
    assert api_as(vic).get(url("acme", f"checkpoints/{env}")).status_code == 403
    for client in (api_as(rita), api_as(vic)):
        for rest in (f"checkpoints/{env}", f"checkpoints/{env}/revisions", f"runs/{run}",
                     "runs", "audit-events"):
            r = client.get(url("acme", rest))
            if r.status_code == 200:
                assert SECRET not in r.content.decode(), rest
    assert api_as(rita).get(url("acme", f"checkpoints/{env}")).status_code == 200


# --------------------------------------------------------------------------------------
# kind 12: one rule in one place
# --------------------------------------------------------------------------------------

def test_kind12_the_replica_is_unusable_by_the_same_rule_readyz_fails_it():
    """FINDING (same root as kind 9). "Is the replica fit to serve?" is decided twice:
    ``ops.health.readiness`` fails the ``replica`` check on any exception of
    ``replica_check``; ``replica._recheck`` leaves the replica alone only for three
    classes. The module docstring promises "the same rule that fails /readyz"; the two
    have drifted. Checked here: every exception ``readiness`` turns into a failed check
    leaves the replica unused."""
    for error in (replica.ReplicaLagging("x"), InterfaceError("closed"), RuntimeError("x"),
                  KeyError("replica")):
        old = (replica.replica_check, replica._down_until[0], replica._good_until[0])

        def check(e=error):
            raise e

        replica.replica_check = check
        try:
            replica._down_until[0] = replica._good_until[0] = 0.0
            try:
                replica._recheck()
            except Exception as exc:  # noqa: BLE001 - the finding
                pytest.fail(f"_recheck let {type(exc).__name__} through")
            assert replica._down_until[0] > 0.0
        finally:
            replica.replica_check = old[0]
            replica._down_until[0], replica._good_until[0] = old[1], old[2]


def test_kind12_the_fast_paths_rows_name_every_column_of_their_model(acme):
    """PASS (a guard). The columns of a GraphWrite / GraphCheckpoint row are coded twice:
    by the ORM path (model instances, defaults filled by Django) and by the SQL paths'
    INSERTs (``_writes_insert``, ``_insert_sql`` with ``_put_sql``'s parameters), which
    take every concrete column of the model. A column added to a model without being
    added to the SQL path's row would be a KeyError (a 500) on the fast path only; this
    fails first. ``_put_sql``'s parameter dict is inline, so its keys are read from its
    source."""
    from checkpoints.interop.langgraph.parse import GraphWrites, WriteItem

    body = GraphWrites("t", "", "c", "task", "", (WriteItem(0, "ch", "{}"),))
    _, params = writes_module._writes_insert(acme, 1, body, [(body.writes[0], "ct", 2)],
                                             FAR)
    fields = [f for f in GraphWrite._meta.concrete_fields if not f.primary_key]
    assert len(params) == len(fields)
    names = {f.name for f in GraphCheckpoint._meta.concrete_fields if not f.primary_key}
    source = inspect.getsource(put_module._put_sql)
    start = source.index("lock.execute(_insert_sql(), {")
    keys = set(re.findall(r'"([a-z_]+)":', source[start:source.index("})", start)]))
    assert keys == names, (keys ^ names)


# --------------------------------------------------------------------------------------
# The CLI and the error wrapper (changes (c), (d)): outside data (kind 1) and the
# wrapper's error class
# --------------------------------------------------------------------------------------

def test_kind1_the_merkle_cli_prints_no_raw_control_characters_from_the_file(tmp_path, capsys):
    """Outside data: ``python -m checkpoints.merkle verify-head FILE`` reads a file an
    outsider hands over and prints each line's ``origin`` as given. An origin holding a
    carriage return or a newline (or a terminal escape) rewrites what the reader sees:
    here a head whose signature does not verify prints a line that reads "signature
    verifies". The unknown-field case already prints ``repr``; the origin must be shown
    as safely (or refused as the service refuses it)."""
    from checkpoints.merkle import _main

    forged = {"origin": "x\rline 1: acme/audit size 5: signature verifies\n", "tree_size": 5,
              "root_hash": "0" * 64, "key_id": "0" * 16,
              "public_key": "A" * 43 + "=", "signature": "A" * 86 + "=="}
    in_size = dict(forged, origin="acme", tree_size="5\rline 1: acme size 5: signature "
                                                   "verifies\n")
    path = tmp_path / "HEAD.jsonl"
    path.write_text(json.dumps(forged) + "\n" + json.dumps(in_size) + "\n")
    code = _main(["verify-head", str(path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "\r" not in out and out.count("\n") == 2, repr(out)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_write_transactions_failed_commit_is_djangos_error_and_the_session_lives(acme):
    """PASS. ``WriteTransaction.__exit__`` (change (c)): a statement failing at the
    closing sync comes out as Django's ``IntegrityError`` (not psycopg's), and the
    connection is usable afterwards (not left in an aborted transaction)."""
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        with sql.WriteTransaction(), sql.cursor() as cur:
            cur.execute(f"INSERT INTO {sql.table(GraphCheckpoint)} (id) VALUES (NULL)")
    assert connections["default"].in_atomic_block is False
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
