"""What the bench's parts share: the environment of the bench database, timing, and the
payload every write scenario sends."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent

#: Fixed development secrets: the bench database is throwaway and dropped at the end.
BENCH_ENV = {
    "DJANGO_SETTINGS_MODULE": "recovery.settings",
    "DEBUG": "0",  # no query log, as in production
    "RECOVERY_STATIC_MANIFEST": "1",  # hashed static files, as in production (collect_static)
    "SECRET_KEY": "bench-only-secret-key-0c6b1f0e-not-for-anything-real",
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    "SECURE_SSL_REDIRECT": "0",
    "SESSION_COOKIE_SECURE": "0",
    "CSRF_COOKIE_SECURE": "0",
    "SECURE_HSTS_SECONDS": "0",
    "RECOVERY_INPROCESS_WORKER": "0",
    "RECOVERY_FAST_HASHER": "1",
    "RECOVERY_ENCRYPTION_KEYS": "YmVuY2gtb25seS1rZXktcmVjb3ZlcnktMzJieXRlcyE=",
    "RECOVERY_AUDIT_KEYS": "bench-only-audit-key-recovery-0123456789abcdef",
    "LOG_LEVEL": "ERROR",
    # Errors only (LOG_LEVEL): the per-request access line (recovery.access, INFO, on by
    # default with DEBUG off) would print every one of the bench's requests.
    "RECOVERY_ACCESS_LOG": "0",
}

#: gunicorn's own log (boot, worker starts) at the same level: errors only.
GUNICORN_ARGS = ["--log-level", "error"]


def default_db_name(server_url: str) -> str:
    """The bench database for ``server_url``: its database name with ``_bench`` added
    (``.../recovery`` -> ``recovery_bench``, ``.../recovery_search`` ->
    ``recovery_search_bench``), or the name itself when it already contains "bench"; so
    a developer's ``PG_URL`` of their own database never makes the bench drop another
    developer's bench database."""
    name = urlsplit(server_url).path.lstrip("/") or "recovery"
    return name if "bench" in name else f"{name}_bench"


def bench_url(server_url: str, name: str) -> str:
    """``server_url`` (any database on the server) with the database ``name``."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))


def reset_database(server_url: str, name: str) -> None:
    """Drop and create the database ``name`` (which must contain "bench": this never
    drops anything else)."""
    import psycopg

    if "bench" not in name:
        raise SystemExit(f"bench: refusing to drop {name!r}: a bench database's name "
                         f"contains 'bench'")
    with psycopg.connect(bench_url(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    if "bench" not in name:
        return
    with psycopg.connect(bench_url(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"bench: the server on port {port} did not start") from None
            time.sleep(0.2)


def wait_until_ready(base_url: str, proc, seconds: float = 180) -> None:
    """Wait until the server at ``base_url`` answers ``GET /readyz`` with 200: a worker
    has booted (on a fresh clone each one compiles the whole project first, which on a
    loaded machine takes longer than a request's timeout) and says it is ready
    (database; static files' manifest where ``/readyz`` checks it). Raises
    ``SystemExit`` with the last answer when it does not within ``seconds``, or when
    the server exits."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + seconds
    last = "no answer"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base_url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"{exc.code} {exc.read(2000).decode(errors='replace')}"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    raise SystemExit(f"bench: the server at {base_url} is not ready: {last}")


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size of a process in KiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def payloads(n: int = 8) -> list[dict]:
    """The write scenarios' payloads: ``runifold.agent`` v1 states of about 1.2 KB of JSON
    (``generate_load.agent_payload``), alternating ready / in flight; writes cycle through
    them so each revision differs from the one before."""
    from checkpoints.management.loaddata import agent_payload

    return [agent_payload(1 + i, "turn_in_flight" if i % 2 else "ready_for_turn", seed=i)
            for i in range(n)]


def environ(url: str, var_dir: Path | None = None) -> dict[str, str]:
    """The environment of every process of the bench (this one, writers, gunicorn):
    ``BENCH_ENV``, the database ``url``, and the bench's own var folder ``var_dir``
    (default ``var/bench/var``) with its collected static files in ``staticfiles/``
    there (``RECOVERY_STATIC_ROOT``: with ``DEBUG=0`` the pages need the manifest that
    ``collect_static`` writes)."""
    var_dir = Path(var_dir) if var_dir else ROOT / "var" / "bench" / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL",)}
    env.update(BENCH_ENV)
    env["DATABASE_URL"] = url
    env["RECOVERY_VAR_DIR"] = str(var_dir)
    env["RECOVERY_STATIC_ROOT"] = str(var_dir / "staticfiles")
    return env


def collect_static() -> None:
    """``manage.py collectstatic`` into this process's ``STATIC_ROOT`` (``environ``
    sets it to the bench's var folder; call after ``django.setup()``): the hashed copies
    and the manifest that ``DEBUG=0`` pages and gunicorn's whitenoise read. Fast when
    nothing changed (unchanged files are skipped)."""
    from django.core.management import call_command

    call_command("collectstatic", interactive=False, verbosity=0)


def standalone(doc: str, run, *, runs: int, db: str, extra=None, env: dict | None = None,
               whole_args: bool = False) -> None:
    """The command line of a benchmark that runs on its own PostgreSQL database:
    ``--runs`` (default ``runs``), ``--pg-url`` (``PG_URL``), ``--db`` (default ``db``;
    dropped and created, its name must contain "bench"), ``--keep-db``; ``extra(parser)``
    adds options. Sets the process environment (``environ``, plus ``env``), calls
    ``run(args)`` with ``whole_args`` else ``run(args.runs)``, then closes the
    connections and drops the database unless kept."""
    import argparse

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--runs", type=int, default=runs)
    if extra is not None:
        extra(p)
    p.add_argument("--pg-url", default=os.environ.get("PG_URL")
                   or "postgres://postgres@127.0.0.1:5432/recovery")
    p.add_argument("--db", default=db)
    p.add_argument("--keep-db", action="store_true")
    args = p.parse_args()
    on_own_database(args, lambda: run(args if whole_args else args.runs), env=env)


def on_own_database(args, work, *, env: dict | None = None, drop_env=()):
    """Run ``work()`` on the bench's own database ``args.db`` of the server
    ``args.pg_url`` (dropped and created first; dropped after unless ``args.keep_db``),
    with the process environment pointing at it (``environ``, plus ``env``, without the
    names in ``drop_env``). Returns what ``work`` returns."""
    url = bench_url(args.pg_url, args.db)
    reset_database(args.pg_url, args.db)
    os.environ.update(environ(url))
    os.environ.update(env or {})
    for name in drop_env:
        os.environ.pop(name, None)
    try:
        return work()
    finally:
        from django.db import connections  # after django.setup() in work()

        connections.close_all()
        if not args.keep_db:
            drop_database(args.pg_url, args.db)
