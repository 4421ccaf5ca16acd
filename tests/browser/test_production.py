"""The README's production start-up, exactly (issue 9, item 8): ``collectstatic``,
``migrate``, then ``gunicorn recovery.wsgi`` (gunicorn.conf.py: threaded workers) with
``DEBUG=0``, a real ``SECRET_KEY`` and ``ALLOWED_HOSTS``, on a free port of 127.0.0.1,
against a throwaway database (a new PostgreSQL database beside ``DATABASE_URL``'s when it
is set, else a SQLite file in a temporary ``RECOVERY_VAR_DIR``); a tenant and a reviewer
made with the management commands. Then, in Chromium: the dashboard has its CSS (a
computed value only static/css/app.css sets) and htmx (``window.htmx``), and
``/api/docs/`` renders Swagger UI from local static files: every request of both pages is
to the server itself. Also against the real gunicorn: hashed, compressed static files
with far-future caching, ``/healthz``, ``/readyz``, ``/metrics`` (the token; the domain
gauges and django-prometheus' counters summed over the worker processes) and JSON log
lines carrying the request id.

Plain http on localhost: the documented switch for a deployment whose TLS is handled in
front of it (docs/security/hardening.md 5) is used, ``SECURE_SSL_REDIRECT=0`` and the two
cookie flags; everything else keeps its production default."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography.fernet import Fernet

from tests.browser.common import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.browser,
    # A production install in a subprocess (collectstatic, migrate, gunicorn), each step
    # allowed 300 s: more than pytest-timeout's default for the whole test.
    pytest.mark.timeout(900),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"{CHROMIUM} is missing: apt-get install -y chromium"),
]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "production-test-pw-4411"  # satisfies AUTH_PASSWORD_VALIDATORS
METRICS_TOKEN = secrets.token_urlsafe(32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def database(tmp_path):
    """``DATABASE_URL`` of a throwaway database, or None (SQLite under the var dir)."""
    configured = os.environ.get("DATABASE_URL")
    if not configured:
        yield None
        return
    import psycopg

    parts = urlsplit(configured)
    name = f"recovery_prod_{uuid.uuid4().hex[:12]}"
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield parts._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def production(tmp_path, database):
    """The environment of a production node (README "Production")."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "localhost,127.0.0.1",
        "RECOVERY_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "RECOVERY_AUDIT_KEYS": secrets.token_urlsafe(40),
        "RECOVERY_METRICS_TOKEN": METRICS_TOKEN,
        "RECOVERY_VAR_DIR": str(tmp_path / "var"),
        "WEB_CONCURRENCY": "2",
        "GUNICORN_THREADS": "2",
        # TLS is not ours here: the documented switches (docs/security/hardening.md 5).
        "SECURE_SSL_REDIRECT": "0",
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
    }
    if database:
        env["DATABASE_URL"] = database
    return env


def manage(env, *args, stdin: str | None = None) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def server(production, tmp_path):
    """The started service: ``(base url, path of gunicorn's log)``."""
    manage(production, "collectstatic", "--noinput")
    manage(production, "migrate", "--noinput")
    manage(production, "create_tenant", "acme", "--name", "Acme Corp")
    manage(production, "create_account", "rita", "--password-stdin", stdin=PASSWORD + "\n")
    manage(production, "grant", "rita", "reviewer", "acme")
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "recovery.wsgi", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT, env={**production, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")},
            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"gunicorn did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
        yield f"http://localhost:{port}", log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fetch(url: str, **headers) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class Requests:
    """Every request a browser context makes; any to another host is aborted (and kept)."""

    def __init__(self, context, base: str):
        self.netloc = urlsplit(base).netloc
        self.urls: list[str] = []
        context.route("**/*", self.route)

    def route(self, route):
        url = route.request.url
        self.urls.append(url)
        if urlsplit(url).netloc == self.netloc or url.startswith("data:"):
            route.continue_()
        else:
            route.abort()

    def elsewhere(self) -> list[str]:
        return [u for u in self.urls
                if not u.startswith("data:") and urlsplit(u).netloc != self.netloc]


def test_the_documented_production_start_serves_the_dashboard_and_api_docs(server):
    base, log_path = server
    sync_api = pytest.importorskip("playwright.sync_api")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(viewport={"width": 1280, "height": 900})
            seen = Requests(context, base)
            page = context.new_page()
            page.set_default_timeout(20_000)
            page.goto(f"{base}/login/")
            page.fill("#id_username", "rita")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/t/acme/**")
            page.wait_for_load_state("load")
            # A value only app.css sets, and what it does to the page.
            assert page.evaluate("getComputedStyle(document.documentElement)"
                                 ".getPropertyValue('--accent').trim()") == "#2f5bd3"
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") \
                == "rgb(245, 246, 248)"
            assert page.evaluate("typeof window.htmx") == "object"
            assert page.evaluate("window.htmx.version").startswith("2.")
            stylesheet = page.evaluate("document.querySelector('link[rel=stylesheet]').href")
            assert re.search(r"/static/css/app\.[0-9a-f]{12}\.css$", stylesheet), stylesheet

            page.goto(f"{base}/api/docs/")
            page.wait_for_selector(".swagger-ui .info .title")
            page.wait_for_selector(".opblock-tag", state="attached")
            assert "recovery API" in page.inner_text(".swagger-ui .info .title")
            assert any("/static/drf_spectacular_sidecar/swagger-ui-dist/" in u
                       for u in seen.urls)
            assert any(u.endswith("/api/schema/") or "/api/schema/?" in u for u in seen.urls)
            assert seen.elsewhere() == [], "requests left localhost"
        finally:
            chromium.close()

    # Static files: hashed names, compressed, cached for a year.
    status, headers, body = fetch(stylesheet, **{"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers.get("Content-Encoding") == "gzip"
    assert "immutable" in headers["Cache-Control"] and "max-age=315360000" in \
        headers["Cache-Control"]

    # The probes.
    status, headers, body = fetch(f"{base}/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    status, headers, body = fetch(f"{base}/readyz")
    ready = json.loads(body)
    # No broker: the in-process worker sweeps (its thread started with the first request).
    assert (status, ready["status"], ready["checks"]) == (200, "ok", {
        "audit": "ok",
        "broker": "not configured", "database": "ok", "login_slots": "ok", "migrations": "ok",
        "notifications": "not configured",
        "retention": "not configured",
        "worker": "ok", "static_manifest": "ok"})
    assert set(ready["heartbeat"]) <= {"sweep", "sweep.inprocess", "job", "retention",
                                       "retention.round", "notify", "audit.integrate"}

    # The metrics: closed without the token, summed over both workers with it.
    assert fetch(f"{base}/metrics")[0] == 401
    request_id = "prod-test-" + uuid.uuid4().hex
    status, headers, body = fetch(f"{base}/metrics", Authorization=f"Bearer {METRICS_TOKEN}",
                                  **{"X-Request-ID": request_id})
    assert status == 200 and headers["X-Request-ID"] == request_id
    text = body.decode()
    assert 'recovery_runs{state="healthy",tenant="acme"} 0.0' in text
    assert 'recovery_audit_events{tenant="acme"}' in text
    logins = re.search(r'django_http_requests_total_by_view_transport_method_total\{'
                       r'method="POST",transport="http",view="login"\} (\S+)', text)
    assert logins and float(logins.group(1)) >= 1

    # The log: JSON lines (DEBUG=0), this request's with its id.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and request_id not in log_path.read_text():
        time.sleep(0.2)
    ours = [json.loads(line) for line in log_path.read_text().splitlines()
            if request_id in line]
    assert ours, log_path.read_text()[-3000:]
    assert ours[0]["request_id"] == request_id and ours[0]["logger"] == "recovery.access"
    assert ours[0]["status"] == 200 and ours[0]["path"] == "/metrics"
