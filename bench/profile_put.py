#!/usr/bin/env python
"""Where the milliseconds of one checkpoint ``PUT`` go (issue 22, item 3), in one process.

    .venv/bin/python -m bench.profile_put [--n 500] [--profile 30] [--db recovery_profile_bench]

Not run by the test suite; asserts no timing. Drops and creates its own database (the
name must contain "bench"), migrates it, makes a tenant, a writer and a token
(``bench.writes.Fixture``), then sends ``--n`` checkpoint PUTs (If-Match, a ~1.2 KB
``runifold.agent`` payload, bearer token) straight to Django's WSGI handler, as gunicorn
would, with the bench's production-like settings (``DEBUG=0``, ``bench.common.BENCH_ENV``):

1. **round trips per PUT**: libpq's own trace of the request's connection
   (``PQtrace``): every ``Sync`` or simple ``Query`` message the client sends is one
   round trip to the server (the connection health check, ``BEGIN`` and ``COMMIT``
   included), and the statements are listed;
2. **wall time per PUT** (p50, mean), and the same for the service alone
   (``services.checkpoint_put`` with a parsed envelope): the difference is what the HTTP
   layer costs in-process (no socket, no gunicorn);
3. with ``--wait-split N``: N service calls, then N PUTs, each split into the time spent
   in psycopg's ``wait`` (sending, the server, receiving) and the rest (Python), with
   each wait's p50 by the generator that waited (``--keep-db`` and ``PGOPTIONS='-c
   track_functions=all'`` then show each trigger's time in ``pg_stat_user_functions``);
   ``--profile-service N``: the service alone under ``cProfile``, by own time;
4. with ``--profile N``: ``cProfile`` over N PUTs, the functions with the most cumulative
   time that belong to the layers the issue names (DRF, authentication, JSON, encryption,
   logging, metrics, middleware), in ms per PUT;
5. with ``--langgraph N``: ``RecoverySaver.put`` (``bench.bench_langgraph.Chain``) whose
   ``httpx`` transport is Django's WSGI handler in this process (``httpx.WSGITransport``):
   its round trips per put, N puts timed, split into the client's own time (serialising
   the checkpoint, the request, decoding the answer) and the server's, and the server
   side under ``cProfile`` by own time when ``--profile-service`` is given too.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_url, drop_database, environ, reset_database  # noqa: E402


def _wsgi_environ(path: str, body: bytes, token: str, revision: int) -> dict:
    return {
        "REQUEST_METHOD": "PUT", "PATH_INFO": path, "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1:8000", "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_ACCEPT": "application/json",
        "HTTP_IF_MATCH": f'"{revision}"', "HTTP_CONNECTION": "keep-alive",
        "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
        "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


class Writer:
    """PUTs of one checkpoint through the WSGI handler, revision after revision."""

    def __init__(self, fx, slug: str, app=None):
        from django.core.handlers.wsgi import WSGIHandler

        from bench.writes import envelope, payload_at

        self.app = app or WSGIHandler()
        self.fx, self.slug = fx, slug
        self.target = fx.checkpoint(slug)
        self.revision = 0
        self._envelope, self._payload_at = envelope, payload_at

    def put(self) -> int:
        t, rev = self.target, self.revision
        body = json.dumps(self._envelope(t.checkpoint_id, t.run_id, rev + 1,
                                         self._payload_at(self.fx.payloads, rev + 1))).encode()
        path = f"/api/v1/tenants/{self.slug}/checkpoints/{t.checkpoint_id}"
        status = []
        chunks = self.app(_wsgi_environ(path, body, self.fx.tokens[self.slug], rev),
                          lambda s, h, *a: status.append(s))
        b"".join(chunks)
        getattr(chunks, "close", lambda: None)()
        if not status[0].startswith("200"):
            raise SystemExit(f"PUT answered {status[0]}")
        self.revision = rev + 1
        return self.revision


#: ``--compare``: each change of the lean path switched off in turn (issue 22, item 3).
#: A variant is (name, quiet health check, token+tenant+role in one statement, the
#: middleware names left out).
SESSION_STACK = ("checkpoints.ops.security.SessionCookieDeletionMiddleware",
                 "django.contrib.sessions.middleware.SessionMiddleware",
                 "django.middleware.csrf.CsrfViewMiddleware",
                 "django.contrib.auth.middleware.AuthenticationMiddleware",
                 "django.contrib.messages.middleware.MessageMiddleware",
                 "axes.middleware.AxesMiddleware")
PROMETHEUS = ("django_prometheus.middleware.PrometheusBeforeMiddleware",
              "django_prometheus.middleware.PrometheusAfterMiddleware")
REST = ("checkpoints.ops.health.RequestIdMiddleware", "django_guid.middleware.guid_middleware",
        "django.middleware.security.SecurityMiddleware",
        "whitenoise.middleware.WhiteNoiseMiddleware", "csp.middleware.CSPMiddleware",
        "django_permissions_policy.PermissionsPolicyMiddleware",
        "checkpoints.ops.security.PrivateNoStoreMiddleware",
        "checkpoints.ops.security.LoginSlotsMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
        "django_htmx.middleware.HtmxMiddleware",
        "checkpoints.jobs.inprocess.InProcessWorkerMiddleware")
VARIANTS = [
    ("before: SELECT 1 health check, token then tenant+role", False, False, ()),
    ("quiet health check", True, False, ()),
    ("quiet check + token, tenant and role in one statement", True, True, ()),
    ("... and without the session/CSRF/auth/messages/axes middleware", True, True,
     SESSION_STACK),
    ("... and without django-prometheus' request metrics", True, True,
     SESSION_STACK + PROMETHEUS),
    ("... and without every other middleware", True, True, SESSION_STACK + PROMETHEUS + REST),
]


def compare(fx, slug: str, rounds: int, per: int) -> list[tuple[str, float, float]]:
    """The PUT's p50 and mean per variant (``VARIANTS``), interleaved: ``rounds`` times
    ``per`` PUTs of each in turn, so the machine's slow spells fall on all of them."""
    from django.conf import settings
    from django.test.utils import override_settings

    from checkpoints.api.views.common import TenantApi

    writers = []
    for _name, _quiet, _scoped, without in VARIANTS:
        with override_settings(MIDDLEWARE=[m for m in settings.MIDDLEWARE if m not in without]):
            w = Writer(fx, slug)
        writers.append(w)
        for _ in range(5):
            w.put()
    lat = [[] for _ in VARIANTS]
    try:
        for _ in range(rounds):
            for i, (_name, quiet, scoped, _without) in enumerate(VARIANTS):
                settings.RECOVERY_DB_QUIET_CHECK = quiet
                TenantApi.reads_tenant_with_token = scoped
                for _ in range(per):
                    a = time.perf_counter()
                    writers[i].put()
                    lat[i].append((time.perf_counter() - a) * 1000)
    finally:
        settings.RECOVERY_DB_QUIET_CHECK = True
        TenantApi.reads_tenant_with_token = True
    return [(v[0], statistics.median(x), statistics.fmean(x)) for v, x in zip(VARIANTS, lat,
                                                                             strict=True)]


def lean(fx, slug: str, rounds: int, per: int) -> None:
    """``--lean``: the same PUT through the floor (``bench/floor_wsgi.py``), the product's
    service functions behind a bare WSGI route (``bench/lean_wsgi.py``) and the product
    (Django's handler), interleaved, in this process: each one's p50 and its ratio to the
    floor, which is what the HTTP target compares (through gunicorn and 4 writers the
    ratio also carries gunicorn's own time per request, the same for all three)."""
    from bench import floor_wsgi, lean_wsgi

    apps = [("floor: bare WSGI, one CAS + history statement", floor_wsgi.app),
            ("lean: the product's services behind a bare WSGI route", lean_wsgi.app),
            ("product: Django, DRF and the middleware", None)]
    writers = [Writer(fx, slug, app) for _, app in apps]
    for w in writers:
        for _ in range(20):
            w.put()
    lat = [[] for _ in apps]
    for _ in range(rounds):
        for i, w in enumerate(writers):
            for _ in range(per):
                a = time.perf_counter()
                w.put()
                lat[i].append((time.perf_counter() - a) * 1000)
    floor = statistics.median(lat[0])
    print(f"in-process PUTs, {rounds} interleaved rounds of {per} each (ms per PUT):")
    for (name, _), x in zip(apps, lat, strict=True):
        p50 = statistics.median(x)
        print(f"   {name:<56} p50 {p50:6.2f}  mean {statistics.fmean(x):6.2f}  "
              f"floor/this {floor / p50:.2f}")


class SaverWriter:
    """``RecoverySaver.put`` of one thread's chain, the server in this process: the
    saver's ``httpx`` transport calls Django's WSGI handler, which ``server_time`` times
    (seconds, summed)."""

    def __init__(self, fx, slug: str):
        import httpx
        from django.core.handlers.wsgi import WSGIHandler

        from bench.bench_langgraph import Chain
        from recovery_client.langgraph import RecoverySaver

        handler = WSGIHandler()
        self.server_time = 0.0
        self.profiler: cProfile.Profile | None = None  # set: the server side runs under it

        def app(environ, start_response):
            t0 = time.perf_counter()
            try:
                if self.profiler is not None:
                    return self.profiler.runcall(lambda: list(handler(environ,
                                                                      start_response)))
                return list(handler(environ, start_response))
            finally:
                self.server_time += time.perf_counter() - t0

        saver = RecoverySaver("http://127.0.0.1:8000", slug, fx.tokens[slug], timeout_s=30,
                              transport=httpx.WSGITransport(app=app))
        self.chain = Chain(saver, f"thread-{uuid.uuid4()}", fx.payloads)

    def put(self) -> None:
        self.chain.put()


def round_trips(writer, n: int) -> dict:
    """libpq's trace of ``n`` PUTs on this thread's connection: frontend ``Sync`` and
    ``Query`` messages (each waits for the server: a round trip) and the SQL sent."""
    from django.db import connection

    writer.put()  # the connection is open and past its first request
    fd, path = tempfile.mkstemp(prefix="pqtrace-")
    pgconn = connection.connection.pgconn
    pgconn.trace(fd)
    try:
        for _ in range(n):
            writer.put()
    finally:
        pgconn.untrace()
        os.close(fd)
    text = Path(path).read_text(errors="replace")
    if os.environ.get("KEEP_TRACE"):
        print("trace:", path)
    else:
        os.unlink(path)
    syncs = len(re.findall(r"\tF\t\d+\tSync", text))
    queries = re.findall(r'\tF\t\d+\tQuery\t ?"(.*?)"', text)
    parses = re.findall(r'\tF\t\d+\tParse\t ?"[^"]*"\s+"(.*?)"', text)
    return {"round_trips_per_put": (syncs + len(queries)) / n,
            "statements": [m[1][:100] for m in re.finditer(
                r'\tF\t\d+\t(?:Query\t ?|Parse\t ?"[^"]*"\s+)"(.*?)"', text)][
                    : (len(queries) + len(parses)) // n]}


def warm_and_trace(writer, label: str) -> None:
    """20 calls of ``writer.put`` unmeasured, then 20 traced: prints the round trips per
    call and the statements of one."""
    for _ in range(20):
        writer.put()
    trips = round_trips(writer, 20)
    print(f"round trips per {label}: {trips['round_trips_per_put']:g}")
    for s in trips["statements"]:
        print(f"   {s}")


def timed(fn, n: int) -> dict:
    lat = []
    for _ in range(n):
        a = time.perf_counter()
        fn()
        lat.append((time.perf_counter() - a) * 1000)
    return {"p50_ms": round(statistics.median(lat), 3),
            "mean_ms": round(statistics.fmean(lat), 3)}


#: Layers of the request and the functions that stand for them in the profile.
LAYERS = [
    ("WSGI + middleware, all (handler.__call__)", r"handlers/wsgi.py.*\(__call__\)"),
    ("DRF dispatch (APIView.dispatch)", r"rest_framework/views.py.*\(dispatch\)"),
    ("DRF initial (auth, tenant, perms)", r"api/views/common.py.*\(initial\)"),
    ("  authentication (token_user)", r"api/auth.py.*\(token_user\)"),
    ("  tenant + role (access_tenant)", r"permissions.py.*\(access_tenant\)"),
    ("view handler (CheckpointApi.put)", r"views/checkpoints.py.*\(put\)"),
    ("  read_object (body + JSON parse)", r"common.py.*\(read_object\)"),
    ("  services.parse_envelope", r"\(parse_envelope\)"),
    ("  services.checkpoint_put", r"\(checkpoint_put\)"),
    ("    encryption (crypto.encrypt*)", r"crypto.py.*\(encrypt"),
    ("finalize_response + render", r"rest_framework/views.py.*\(finalize_response\)"),
    ("DB health check (is_usable)", r"\(is_usable\)"),
    ("DB connect/close checks", r"\(close_if_unusable_or_obsolete\)"),
    ("logging (Logger.*)", r"logging/__init__.py.*\((info|debug|_log|handle)\)"),
    ("metrics (prometheus .inc/.observe)", r"prometheus_client/metrics.py.*\((inc|observe)\)"),
    ("middleware and handler, outside DRF (derived)", None),
]

#: Modules whose own time (``tottime``: not what they call) is summed, per label.
OWN_TIME = [
    ("sessions middleware (own time)", r"sessions/middleware.py|sessions/backends"),
    ("CSRF middleware (own time)", r"middleware/csrf.py"),
    ("messages middleware (own time)", r"contrib/messages/"),
    ("auth middleware (own time)", r"contrib/auth/middleware.py"),
    ("axes middleware (own time)", r"axes/"),
    ("CSP middleware (own time)", r"csp/"),
    ("django-guid (own time)", r"django_guid/"),
    ("whitenoise (own time)", r"whitenoise/"),
    ("django_prometheus + prometheus_client (own time)", r"prometheus"),
    ("permissions_policy / htmx (own time)", r"permissions_policy|django_htmx"),
    ("checkpoints.ops (own time: request id, no-store, login slots)", r"checkpoints/ops/"),
    ("logging (own time)", r"logging/"),
    ("psycopg (own time, includes waiting for the server)", r"psycopg"),
    ("json (own time)", r"json/|jsonparse"),
    ("DRF (own time)", r"rest_framework/"),
    ("Django ORM, sql compiler (own time)", r"django/db/models/"),
]


def profile(writer: Writer, n: int) -> list[tuple[str, float]]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        writer.put()
    prof.disable()
    stats = pstats.Stats(prof)
    out = []
    for label, pattern in LAYERS:
        if pattern is None:
            out.append((label, out[0][1] - out[1][1]))
            continue
        rx = re.compile(pattern)
        total = 0.0
        for (file, line, name), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
            key = f"{file}:{line}({name})"
            if rx.search(key):
                # cumulative time, not counting calls from a function of the same pattern
                inner = sum(v[3] for c, v in callers.items()
                            if rx.search(f"{c[0]}:{c[1]}({c[2]})"))
                total += ct - inner
        out.append((label, total / n * 1000))
    for label, pattern in OWN_TIME:
        rx = re.compile(pattern)
        total = sum(v[2] for (file, _line, _name), v in stats.stats.items() if rx.search(file))
        out.append((label, total / n * 1000))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats(os.environ.get("PROFILE_SORT", "cumulative")).print_stats(45)
    return out, buf.getvalue()


def wait_split(calls: list[tuple[str, object]], n: int) -> None:
    """``--wait-split``: ``n`` calls of each ``(label, fn)``, each split into the time in
    psycopg's ``wait`` (sending, the server, receiving) and the rest (Python), with each
    wait's p50 by the generator that waited."""
    import psycopg

    spent = {"wait": 0.0}
    per_wait: list[float] = []
    names: list[str] = []
    real_wait = psycopg.Connection.wait

    def counted(self, gen, *a, **kw):
        t0 = time.perf_counter()
        try:
            return real_wait(self, gen, *a, **kw)
        finally:
            dt = time.perf_counter() - t0
            spent["wait"] += dt
            per_wait.append(dt)
            names.append(getattr(getattr(gen, "gi_code", None), "co_name", "?"))

    psycopg.Connection.wait = counted
    try:
        for label, fn in calls:
            spent["wait"] = 0.0
            del per_wait[:], names[:]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            total = time.perf_counter() - t0
            print(f"{label}, {n} calls: {total / n * 1e3:.3f} ms each, of which in "
                  f"psycopg's wait (sending, the server, receiving) "
                  f"{spent['wait'] / n * 1e3:.3f} ms, Python "
                  f"{(total - spent['wait']) / n * 1e3:.3f} ms")
            k = len(per_wait) // n
            print(f"   {k} waits per call; ms each (p50 over the calls): " + ", ".join(
                f"{names[i]} {statistics.median(per_wait[i::k]) * 1e3:.3f}"
                for i in range(k)))
    finally:
        psycopg.Connection.wait = real_wait


def langgraph(fx, slug: str, n: int, profile_n: int, split_n: int = 0) -> None:
    """``--langgraph``: ``RecoverySaver.put`` with its server in this process."""
    w = SaverWriter(fx, slug)
    warm_and_trace(w, "RecoverySaver.put")
    w.server_time = 0.0
    t0 = time.perf_counter()
    took = timed(w.put, n)
    total = time.perf_counter() - t0
    print(f"RecoverySaver.put, {n} puts: p50 {took['p50_ms']} ms, mean {took['mean_ms']} ms; "
          f"the server (WSGI handler) {w.server_time / n * 1e3:.3f} ms of it, the client "
          f"{(total - w.server_time) / n * 1e3:.3f} ms")
    if split_n:
        wait_split([("RecoverySaver.put", w.put)], split_n)
    if profile_n:
        prof = w.profiler = cProfile.Profile()
        for _ in range(profile_n):
            w.put()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(
            os.environ.get("PROFILE_SORT", "tottime")).print_stats(45)
        print(f"the server side of {profile_n} puts under cProfile:")
        print(out.getvalue())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_put",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--pg-url", default=(os.environ.get("PG_URL") or os.environ.get(
        "DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/recovery"),
                   help="the PostgreSQL server to use (PG_URL, else DATABASE_URL); the "
                        "profile runs in its own --db there")
    p.add_argument("--db", default="recovery_profile_bench",
                   help="its own database, DROPPED and created again on every run, and "
                        "dropped at the end unless --keep-db (its name must contain "
                        "'bench')")
    p.add_argument("--n", type=int, default=500, help="timed PUTs")
    p.add_argument("--profile", type=int, default=0, help="PUTs under cProfile")
    p.add_argument("--compare", type=int, default=0,
                   help="rounds of the interleaved before/after comparison (VARIANTS)")
    p.add_argument("--print-profile", action="store_true", help="cProfile's own top 45 too")
    p.add_argument("--wait-split", type=int, default=0,
                   help="calls of services.checkpoint_put alone, split into the time in "
                        "psycopg's wait and the rest (Python)")
    p.add_argument("--profile-service", type=int, default=0,
                   help="calls of services.checkpoint_put alone under cProfile: its top 45 "
                        "functions by own time")
    p.add_argument("--langgraph", type=int, default=0,
                   help="RecoverySaver.put calls, its server in this process: round trips, "
                        "time split into client and server")
    p.add_argument("--lean", type=int, default=0,
                   help="rounds of 100 PUTs each through the floor, a bare WSGI route to "
                        "the product's services (bench/lean_wsgi.py) and the product, "
                        "interleaved")
    p.add_argument("--keep-db", action="store_true")
    args = p.parse_args(argv)
    url = bench_url(args.pg_url, args.db)
    os.environ.update(environ(url))
    os.environ.pop("CELERY_BROKER_URL", None)
    reset_database(args.pg_url, args.db)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from bench.common import payloads
    from bench.writes import Fixture, envelope, payload_at

    try:
        call_command("migrate", verbosity=0)
        fx = Fixture()
        fx.payloads = payloads()
        fx.tenant("bench-p")
        if args.langgraph:
            return langgraph(fx, "bench-p", args.langgraph, args.profile_service,
                             args.wait_split)
        if args.lean:
            return lean(fx, "bench-p", args.lean, 100)
        writer = Writer(fx, "bench-p")
        warm_and_trace(writer, "PUT")
        http = timed(writer.put, args.n)

        from checkpoints import services

        target = fx.checkpoint("bench-p")
        tenant, actor = fx.tenants["bench-p"], fx.writers["bench-p"]
        state = {"rev": 0}

        def service_put():
            rev = state["rev"]
            env = services.parse_envelope(
                envelope(target.checkpoint_id, target.run_id, rev + 1,
                         payload_at(fx.payloads, rev + 1)), url_id=target.checkpoint_id)
            services.checkpoint_put(actor=actor, tenant=tenant, envelope=env,
                                    expected_revision=rev)
            state["rev"] = rev + 1

        svc = timed(service_put, args.n)
        print(f"PUT through the WSGI handler: p50 {http['p50_ms']} ms, mean "
              f"{http['mean_ms']} ms ({args.n} PUTs)")
        print(f"services.checkpoint_put alone: p50 {svc['p50_ms']} ms, mean "
              f"{svc['mean_ms']} ms; the HTTP layer in-process: "
              f"{http['p50_ms'] - svc['p50_ms']:.3f} ms (p50)")
        if args.wait_split:
            wait_split([("services.checkpoint_put alone", service_put),
                        ("PUT through the WSGI handler", writer.put)], args.wait_split)
        if args.profile_service:
            prof = cProfile.Profile()
            prof.runcall(lambda: [service_put() for _ in range(args.profile_service)])
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(
                os.environ.get("PROFILE_SORT", "tottime")).print_stats(45)
            print(f"services.checkpoint_put alone, cProfile over {args.profile_service} "
                  f"calls, by {os.environ.get('PROFILE_SORT', 'own time')}:")
            print(out.getvalue())
        if args.compare:
            print(f"interleaved, {args.compare} rounds of 50 PUTs each (ms per PUT):")
            base = None
            for name, p50, mean in compare(fx, "bench-p", args.compare, 50):
                base = base or p50
                print(f"   {name:<66} p50 {p50:6.2f}  mean {mean:6.2f}  "
                      f"({p50 - base:+.2f} ms p50)")
        if args.profile:
            layers, text = profile(writer, args.profile)
            print(f"cProfile over {args.profile} PUTs (ms per PUT, cumulative, profiler "
                  f"overhead included):")
            for label, ms in layers:
                print(f"   {label:<48} {ms:7.3f}")
            if args.print_profile:
                print(text)
    finally:
        connections.close_all()
        if not args.keep_db:
            drop_database(args.pg_url, args.db)


if __name__ == "__main__":
    uuid.uuid4()
    main()
