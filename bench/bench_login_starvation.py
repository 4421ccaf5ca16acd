#!/usr/bin/env python
"""Login starvation benchmark: API latency while wrong-password loops hammer the login.

Password hashing is CPU-heavy by design, so guessers that reach the hasher take CPU from
every other request. This starts a real server (gunicorn, the production hasher) on a
throwaway test database of the configured kind (``DATABASE_URL``, else embedded SQLite),
then measures API GET latency (bearer token, ``GET /api/v1/tenants/bench/runs``):

1. baseline: nobody logs in;
2. under attack: N threads loop wrong passwords at ``/login/`` for the account
   ``bench-reviewer`` from 127.0.0.1 while the API is timed; with ``--spread``, each
   guess comes from a new address for a new username instead (a botnet: the server is
   told it is behind one proxy and each guess sends its own ``X-Forwarded-For``), which
   no per-account or per-address lockout stops;
3. then the right password is tried once at ``/login/``.

It prints numbers; it asserts nothing (a benchmark, not a test; see
tests/views/test_brute_force.py for the lockout behaviour). Every request goes to
127.0.0.1 and every loop is bounded in time.

    .venv/bin/python bench/bench_login_starvation.py [--guessers 4] [--seconds 20]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/recovery .venv/bin/python \\
        bench/bench_login_starvation.py
"""

from __future__ import annotations

import argparse
import http.client
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
# The real hasher: measuring logins with the fast test hasher would hide the problem.
os.environ.pop("RECOVERY_FAST_HASHER", None)

USERNAME = "bench-reviewer"
PASSWORD = "bench-correct-horse-battery"  # satisfies AUTH_PASSWORD_VALIDATORS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One keep-alive connection with a cookie jar (enough for CSRF and the session)."""

    def __init__(self, port: int):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.cookies: dict[str, str] = {}
        self.forwarded_for: str | None = None

    def request(self, method: str, path: str, body: str | None = None,
                headers: dict | None = None) -> tuple[int, str, dict]:
        headers = dict(headers or {})
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if self.forwarded_for:
            headers["X-Forwarded-For"] = self.forwarded_for
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read().decode("utf-8", "replace")
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                if attempt == 2:
                    raise
        for value in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = value.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]
        return response.status, data, dict(response.headers)

    def login(self, path: str, username: str, password: str) -> int:
        """GET the form (CSRF cookie), POST the credentials; the POST's status."""
        self.request("GET", path)
        token = self.cookies.get("csrftoken", "")
        body = urlencode({"csrfmiddlewaretoken": token, "username": username,
                          "password": password})
        status, _, _ = self.request("POST", path, body=body,
                                    headers={"Referer": f"http://127.0.0.1:{self.port}{path}"})
        return status


def time_api(port: int, token: str, until: float, out: list[float]) -> None:
    client = Client(port)
    while time.monotonic() < until:
        t0 = time.perf_counter()
        status, _, _ = client.request("GET", "/api/v1/tenants/bench/runs",
                                      headers={"Authorization": f"Bearer {token}"})
        if status != 200:
            raise SystemExit(f"API GET answered {status}")
        out.append(time.perf_counter() - t0)


def guess(port: int, until: float, statuses: Counter, lock: threading.Lock, n: int,
          spread: bool) -> None:
    client = Client(port)
    i = 0
    while time.monotonic() < until:
        i += 1
        if spread:
            client.forwarded_for = f"10.{n}.{i // 250 % 250}.{i % 250 + 1}"
        status = client.login("/login/", f"nobody-{n}-{i}" if spread else USERNAME,
                              f"wrong-guess-{n}-{i}")
        with lock:
            statuses[status] += 1


def describe(name: str, lat: list[float]) -> str:
    ms = [v * 1000 for v in lat]
    return (f"{name:<13} {len(ms):>5} GETs  p50 {statistics.median(ms):8.1f} ms  "
            f"p99 {percentile(ms, 0.99):8.1f} ms  max {max(ms):8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guessers", type=int, default=4, help="parallel wrong-login loops")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the attack")
    parser.add_argument("--spread", action="store_true",
                        help="every guess from a new address for a new username")
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    parser.add_argument("--server-args", default="",
                        help="extra gunicorn arguments (default: none, i.e. the shipped "
                        "gunicorn.conf.py; '-c /dev/null' is gunicorn's own default of one "
                        "synchronous worker)")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from checkpoints import services

    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    server = None
    try:
        tenant = services.tenant_create(slug="bench", name="Benchmark")
        person = services.account_create(username=USERNAME, password=PASSWORD)
        services.role_grant(actor=None, tenant=tenant, user=person, role="reviewer")
        writer = services.account_create(username="bench-writer", service=True)
        services.role_grant(actor=None, tenant=tenant, user=writer, role="writer")
        token = services.token_issue(user=writer)
        db = connection.settings_dict
        connection.close()

        env = dict(os.environ, RECOVERY_INPROCESS_WORKER="0")
        if args.spread:
            env["RECOVERY_TRUSTED_PROXY_COUNT"] = "1"
        if db["ENGINE"].endswith("sqlite3"):
            env.pop("DATABASE_URL", None)
            env["RECOVERY_SQLITE_PATH"] = str(db["NAME"])
        else:
            user = db.get("USER") or ""
            auth = user + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
            env["DATABASE_URL"] = (f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:"
                                   f"{db.get('PORT') or 5432}/{db['NAME']}")
        port = free_port()
        cmd = [sys.executable, "-m", "gunicorn", "recovery.wsgi", "--bind",
               f"127.0.0.1:{port}", *shlex.split(args.server_args)]
        server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.2)

        hasher = settings.PASSWORD_HASHERS[0].rsplit(".", 1)[-1]
        print(f"database: {connection.vendor}; server: gunicorn {args.server_args or '(gunicorn.conf.py)'}; "
              f"hasher: {hasher}; {os.cpu_count()} CPUs")
        print(f"lockout: {getattr(settings, 'AXES_FAILURE_LIMIT', None) or 'none'} failures"
              f" (axes {'on' if 'axes' in settings.INSTALLED_APPS else 'not installed'})")

        time_api(port, token, time.monotonic() + 1, [])  # warm up every worker
        baseline: list[float] = []
        time_api(port, token, time.monotonic() + args.baseline_seconds, baseline)
        print(describe("baseline", baseline))

        statuses: Counter = Counter()
        lock = threading.Lock()
        until = time.monotonic() + args.seconds
        guessers = [threading.Thread(target=guess, args=(port, until, statuses, lock, n, args.spread))
                    for n in range(args.guessers)]
        attacked: list[float] = []
        t0 = time.perf_counter()
        for t in guessers:
            t.start()
        time_api(port, token, until, attacked)
        for t in guessers:
            t.join()
        elapsed = time.perf_counter() - t0
        print(describe(f"{args.guessers} guessers" + (" (spread)" if args.spread else ""),
                       attacked))
        slowdown = statistics.median(attacked) / statistics.median(baseline)
        print(f"slowdown      p50 x{slowdown:.1f}, "
              f"p99 x{percentile(attacked, .99) / percentile(baseline, .99):.1f}")
        total = sum(statuses.values())
        print(f"wrong logins  {total} in {elapsed:.1f} s ({total / elapsed:.1f}/s); statuses "
              + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))

        status = Client(port).login("/login/", USERNAME, PASSWORD)
        verdict = {302: "LOGGED IN", 429: "refused: locked out"}.get(status, "refused")
        print(f"right password afterwards -> {status} {verdict}")
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
