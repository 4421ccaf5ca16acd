"""``python manage.py demo``: a dashboard full of runs that really crashed or really raced.

Steps:

1. Recreate the embedded SQLite database (settings' default DB; with ``DATABASE_URL`` set
   it uses that database, which must exist and hold no demo tenants: otherwise one
   paragraph says how to create it or start afresh, ``database_unreachable`` /
   ``_refuse_filled_database``) and migrate it.
2. Create tenants ``acme`` and ``globex`` through the services, each with one account per
   role (viewer, reviewer, two approvers, a writer service account with a token, admin)
   and a 10 s ambiguity threshold.
3. Start the demo payment service and the web server (``runserver --noreload``, with
   ``RECOVERY_RECONCILERS`` pointing at the payment service) as child processes; with
   ``CELERY_BROKER_URL`` set, also ``celery -A recovery worker --beat`` (log
   ``var/demo-celery.log``), since the web server then runs no worker of its own: the
   demo waits for its first sweep before the summary and stops it on exit.
4. Run about ``--workers`` worker processes through ``recovery_client.client`` (at most
   ``--parallel`` at a time): some finish, some SIGKILL themselves at a random
   write-ahead boundary, some pairs race on one checkpoint. Alongside, ``--langgraph``
   runs of the LangGraph refund example (``examples/langgraph_refund``, checkpointed by
   ``RecoverySaver``): some finish, at least two SIGKILL themselves inside the payment
   tool after the charge, so the inbox holds crashed LangGraph runs whose effect
   reconciles like the workers' (left out, with a line saying so, when LangGraph is not
   installed: ``pip install -e '.[test]'``, or ``'.[langgraph]'`` plus ``langgraph``).
   The workers write ``acme.order`` v2, except one acme order written in v1 as the code
   before v2 did and killed after its in-flight checkpoint (``orchestrate.STRANDED``).
   The web server runs with ``RECOVERY_OFFLINE_KINDS=acme.order``: a v1 order is not
   resumed (``reject`` / ``migration_required``) until it is migrated.
5. Wait for the dead workers' leases to expire, run the stale-run sweep, get the stranded
   v1 run's retry requested (``acme-reviewer``) and approved (``acme-approver``), print
   the runs per recovery state, the stranded run, the URL and the logins, and serve until
   Ctrl-C.
6. An acme webhook endpoint with a short grouping window (``DEMO_WINDOW_S``), made by
   acme-admin through the endpoint service (audited), and a webhook receiver
   (``checkpoints.demo.receiver``, a child process on loopback, port + 767) given the
   signing secret that service returned; the web server may post to plain http on
   loopback (``DEMO_NOTIFY_ENV``) and its in-process worker (with a broker: the Celery
   worker, same environment) sends (``jobs.notify``). Its page lists each signed message the
   crashed runs produced, with its headers and whether its signature verifies.
7. While serving (the in-process worker, or the Celery worker and beat, sweeping every
   ``RECOVERY_SWEEP_INTERVAL_S``), run the demo supervisor
   (``checkpoints.demo.supervisor``, a child process): every 3 s it lists each tenant's
   ``retry_approved`` runs with the tenant's writer token and starts ``worker --resume``
   for each (one at a time per run; ``examples.langgraph_refund.run --resume`` for a
   LangGraph run), so a retry approved in the dashboard completes the run by itself; one
   line per resume in ``var/demo-supervisor.log``. The stranded v1 run is answered
   ``migration_required`` and waits; once a person migrates it (the Kinds page's *Migrate
   to v2*, or ``manage.py migrate_checkpoints acme.order --to 2 --tenant acme --run
   RUN``), the supervisor's next pass resumes it to ``completed`` in v2.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connections
from django.test import override_settings

from checkpoints import heartbeat, selectors, services
from checkpoints.demo.orchestrate import STRANDED, plan, plan_langgraph, run_units
from checkpoints.models import Tenant
from checkpoints.vocab import NotificationChannel, NotificationEventType, Role

PASSWORD = "recovery-demo"
TENANTS = {"acme": "Acme Corp", "globex": "Globex"}
# (username suffix, role); the writer is a service account that authenticates by token.
ACCOUNTS = [("viewer", Role.VIEWER), ("reviewer", Role.REVIEWER), ("approver", Role.APPROVER),
            ("approver2", Role.APPROVER), ("writer", Role.WRITER), ("admin", Role.ADMIN)]
LEASE_TTL_S = 5
THRESHOLD_S = 10
#: The demo tenants' subject fields (their data policy): an order's id, which the demo's
#: order runs carry at ``/order_id`` ("A-1001"...), so a hold or an erasure request by
#: ``{"field": "order", "value": "A-1001"}`` finds its runs; and the LangGraph refund
#: runs' thread (``/thread_id``, "refund-LG-2001": one thread per order,
#: ``orchestrate.plan_langgraph``), since their payload, the ``langgraph.checkpoint``
#: summary, holds no channel value and so no ``/order_id`` (docs/langgraph.md): by
#: ``{"field": "thread", "value": "refund-LG-2001"}`` the privacy pages find those too.
DEMO_SUBJECT_FIELDS = {"order": "/order_id", "thread": "/thread_id"}
SWEEP_EVERY_S = 10
SUPERVISE_EVERY_S = 3
# The web server's: acme.order migrates offline, so the stranded v1 run waits for a person.
OFFLINE_KINDS = "acme.order"
# The demo's webhook endpoint groups the crash's runs for this long (120 s by default):
# the receiver's page shows the incident's message soon after the sweep.
DEMO_WINDOW_S = 15
# The demo's receiver is plain http on loopback, which the sender and the endpoint
# service refuse by default: the web server's environment allows both (docs/notifications.md).
DEMO_NOTIFY_ENV = {"RECOVERY_NOTIFY_ALLOW_PRIVATE": "true", "RECOVERY_NOTIFY_ALLOW_HTTP": "true"}


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _langgraph_installed() -> bool:
    """Whether the LangGraph example can run here (the ``langgraph`` extra)."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("langgraph", "langchain_core", "httpx"))


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError(f"{url}: the process exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise CommandError(f"{url} did not answer within {timeout_s:.0f} s")


#: Seconds the demo waits for the Celery worker's first sweep (beat sends one every
#: ``RECOVERY_SWEEP_INTERVAL_S``, the first that long after it starts).
CELERY_READY_S = 90


def _where(db: dict) -> str:
    """``"recovery_x" on 127.0.0.1:5432``: a database named without user or password
    (a SQLite database: its file)."""
    if db["ENGINE"].endswith("sqlite3"):
        return f"the SQLite file {db['NAME']}"
    return f'"{db["NAME"]}" on {db.get("HOST") or "localhost"}:{db.get("PORT") or 5432}'


def _createdb(db: dict, *, drop: bool = False) -> str:
    """The shell command that (re)creates the configured PostgreSQL database."""
    conn = f'-h {db.get("HOST") or "localhost"} -p {db.get("PORT") or 5432}' + (
        f' -U {db["USER"]}' if db.get("USER") else "")
    make = f"createdb {conn} {db['NAME']}"
    return f"dropdb {conn} {db['NAME']} && {make}" if drop else make


def database_unreachable(db: dict, exc: Exception) -> str:
    """One paragraph for ``CommandError`` when migrating the demo's database failed with
    ``exc`` (an ``OperationalError``): a missing PostgreSQL database names the command
    that creates it; anything else (server down, refused login) its first line and the
    way back to the embedded SQLite default. ``db``: ``settings.DATABASES["default"]``."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if db["ENGINE"].endswith("sqlite3"):
        return (f"the demo's SQLite database {db['NAME']} cannot be opened ({first}): "
                f"check that RECOVERY_VAR_DIR is a writable directory.")
    if "does not exist" in first:
        return (f"the demo uses DATABASE_URL, and database {_where(db)} does not exist: "
                f"create it ({_createdb(db)}) and run the demo again, or unset "
                f"DATABASE_URL to use the embedded SQLite file (var/recovery.sqlite3).")
    return (f"the demo uses DATABASE_URL and cannot reach database {_where(db)} ({first}): "
            f"start PostgreSQL or fix DATABASE_URL, or unset DATABASE_URL to use the "
            f"embedded SQLite file (var/recovery.sqlite3).")


def background_sentence(celery_log: Path | None) -> str:
    """What runs the background work while the demo serves, for its "Serving" line:
    with a broker (``CELERY_BROKER_URL``) the Celery worker and beat the demo started
    (``celery_log``: their log); without, the web server's in-process worker."""
    every = settings.RECOVERY_SWEEP_INTERVAL_S
    if celery_log is not None:
        return (f"CELERY_BROKER_URL is set: a Celery worker with beat (a child process of "
                f"the demo, stopped with it; log: {celery_log}) runs the stale-run sweep "
                f"every {every} s, reconcile jobs and the notification rounds.")
    return (f"The web server runs the stale-run sweep and reconcile jobs itself every "
            f"{every} s (no broker: its in-process worker).")


def _wait_celery_sweep(proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Wait until a Celery worker ran beat's sweep (the ``sweep.celery`` heartbeat):
    broker, beat, worker and database all work. Raises ``CommandError`` naming the log
    when the process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError(f"the Celery worker exited with status {proc.returncode}; "
                               f"see {log_path}")
        if "sweep.celery" in heartbeat.read():
            return
        time.sleep(0.5)
    raise CommandError(f"the Celery worker ran no sweep within {timeout_s:.0f} s (is the "
                       f"broker in CELERY_BROKER_URL up?); see {log_path}")


class Command(BaseCommand):
    help = ("Fill a fresh database with runs from real crashed and racing workers, then serve, "
            "resuming runs whose retry was approved.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000, help="web server port")
        parser.add_argument("--payments-port", type=int, default=None,
                            help="payment service port (default: port + 765)")
        parser.add_argument("--receiver-port", type=int, default=None,
                            help="demo webhook receiver port (default: port + 767)")
        parser.add_argument("--workers", type=int, default=36, help="worker processes, about")
        parser.add_argument("--langgraph", type=int, default=6,
                            help="runs of the LangGraph refund example (at least two of them "
                                 "killed inside the payment tool); 0 for none")
        parser.add_argument("--parallel", type=int, default=6, help="workers at a time")
        parser.add_argument("--seed", type=int, default=None, help="plan seed (default random)")
        parser.add_argument("--no-serve", action="store_true",
                            help="stop after the summary instead of serving")

    def handle(self, *args, **opts):
        # Long on purpose: the demo's script in order (migrate, seed, payment service,
        # crash workers, serve), each step saying what it did.
        started = time.monotonic()
        port = opts["port"]
        payments_port = opts["payments_port"] or port + 765
        receiver_port = opts["receiver_port"] or port + 767
        seed = opts["seed"] if opts["seed"] is not None else random.randrange(10_000)
        var_dir = Path(settings.VAR_DIR)
        var_dir.mkdir(parents=True, exist_ok=True)

        # The broker is reached first, so a demo whose broker does not answer stops before
        # it deletes (SQLite) or migrates (PostgreSQL) a database (stop 39's review); its
        # queue is emptied only after the database was found empty, so a deployment's
        # database is refused with its queue untouched (stop 41's attack).
        broker = self._broker_connection() if heartbeat.broker_configured() else None
        self._reset_database()
        if broker is not None:
            self._purge_broker(broker)
        tokens = self._create_tenants()

        children: list[subprocess.Popen] = []
        # SIGTERM (e.g. from a process manager) stops the children like Ctrl-C does, and
        # so does SIGINT when the shell started the demo in the background (``make demo &``
        # starts it with SIGINT ignored, which Python keeps): otherwise ``kill -INT`` of
        # its process group stopped only the supervisor, which handles SIGINT itself, and
        # left the web server and the demo's services running.
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        try:
            payments_db = var_dir / "demo-payments.sqlite3"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{payments_db}{suffix}").unlink(missing_ok=True)
            payments = subprocess.Popen(
                [sys.executable, "-m", "checkpoints.demo.payments", "--port",
                 str(payments_port), "--db", str(payments_db)], cwd=settings.BASE_DIR)
            children.append(payments)
            payments_url = f"http://127.0.0.1:{payments_port}"
            _wait_http(f"{payments_url}/health", 15, payments)
            # Stored per tenant (set_reconciler), so every process that runs reconcile
            # jobs (this one's sweep, the web server's in-process worker) asks the same
            # service the same way; an environment variable set on one process only would
            # let another answer "no look-up".
            for slug in TENANTS:
                tenant = Tenant.objects.get(slug=slug)
                services.reconciler_configure(actor=None, tenant=tenant, service="payments",
                                              plugin="http_status",
                                              url=f"{payments_url}/operations")
                services.reconciler_configure(actor=None, tenant=tenant, service="crm",
                                              plugin="none")

            receiver_log = var_dir / "demo-receiver.jsonl"
            receiver_log.unlink(missing_ok=True)
            receiver_url = f"http://127.0.0.1:{receiver_port}"
            # The endpoint first (the service makes its signing secret and returns it
            # once), then the receiver that verifies with it.
            secret = self._webhook_endpoint(f"{receiver_url}/hook")
            receiver = subprocess.Popen(
                [sys.executable, "-m", "checkpoints.demo.receiver", "--port",
                 str(receiver_port), "--log", str(receiver_log)], cwd=settings.BASE_DIR,
                env=dict(os.environ, RECOVERY_DEMO_WEBHOOK_SECRET=secret))
            children.append(receiver)
            _wait_http(f"{receiver_url}/", 15, receiver)

            log_path = var_dir / "demo-server.log"
            # Only the web server's (runtimes ask it; the demo's own sweep never resumes).
            offline = ",".join(dict.fromkeys(
                k for k in (*os.environ.get("RECOVERY_OFFLINE_KINDS", "").split(","),
                            OFFLINE_KINDS) if k.strip()))
            # The demo's receiver listens on loopback, which the sender refuses by default.
            # Messages link to this server, whatever its port.
            env = dict(os.environ, RECOVERY_OFFLINE_KINDS=offline, **DEMO_NOTIFY_ENV,
                       RECOVERY_PUBLIC_URL=f"http://127.0.0.1:{port}")
            with open(log_path, "w") as log:
                server = subprocess.Popen(
                    [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                     "--noreload"], cwd=settings.BASE_DIR, env=env, stdout=log,
                    stderr=subprocess.STDOUT)
            children.append(server)
            base_url = f"http://127.0.0.1:{port}"
            _wait_http(f"{base_url}/login/", 60, server)
            # With a broker the web server runs no worker of its own (only the watchdog):
            # start one, with beat, so reconcile jobs, the sweep and notifications run.
            celery = celery_log = None
            if heartbeat.broker_configured():
                celery, celery_log = self._start_celery(var_dir, env)
                children.append(celery)

            units = plan(opts["workers"], seed, tuple(TENANTS))
            if opts["langgraph"] > 0 and not _langgraph_installed():
                self.stdout.write("LangGraph is not installed (pip install -e '.[test]', or "
                                  "'.[langgraph]' langgraph): the LangGraph refund runs are "
                                  "left out.")
            elif opts["langgraph"] > 0:
                units += plan_langgraph(opts["langgraph"], seed, tuple(TENANTS))
                random.Random(seed).shuffle(units)
            n_proc = sum(len(u.commands) + (1 if u.setup else 0) for u in units)
            self.stdout.write(f"Running {n_proc} worker processes (seed {seed}, "
                              f"{opts['parallel']} at a time)...")
            tally = run_units(units, base_url=base_url, payments_url=payments_url,
                              tokens=tokens, ttl_s=LEASE_TTL_S, parallel=opts["parallel"],
                              cwd=str(settings.BASE_DIR))
            for unit in units:
                for argv in unit.commands:
                    if "--race-dir" in argv:
                        shutil.rmtree(argv[argv.index("--race-dir") + 1], ignore_errors=True)

            # The dead workers' leases expire after LEASE_TTL_S; then the sweep (what
            # Celery beat does every RECOVERY_SWEEP_INTERVAL_S) marks their runs ambiguous.
            time.sleep(LEASE_TTL_S + 0.5)
            if celery is not None:  # beat's first sweep, run by the worker: it works
                _wait_celery_sweep(celery, celery_log, CELERY_READY_S)
            swept = services.sweep_stale_runs()
            stranded = self._strand(units)
            supervisor_log = var_dir / "demo-supervisor.log"
            self.receiver = (receiver_url, receiver_log)
            self._summary(tally, swept, base_url, payments_url, seed, time.monotonic() - started,
                          log_path, None if opts["no_serve"] else supervisor_log, stranded)
            if opts["no_serve"]:
                return
            supervisor_log.write_text("")
            supervisor = subprocess.Popen(
                [sys.executable, "-m", "checkpoints.demo.supervisor", "--base-url", base_url,
                 "--payments-url", payments_url, "--log", str(supervisor_log),
                 "--interval", str(SUPERVISE_EVERY_S), "--ttl", str(LEASE_TTL_S)],
                cwd=settings.BASE_DIR,
                env=dict(os.environ, RECOVERY_TOKENS=",".join(f"{t}={tok}"
                                                              for t, tok in tokens.items())))
            children.append(supervisor)
            self.stdout.write("Serving; press Ctrl-C to stop. " + background_sentence(celery_log)
                              + " Approved retries are resumed within about "
                              f"{SUPERVISE_EVERY_S} s (log: {supervisor_log}).")
            supervising = True
            while server.poll() is None:
                time.sleep(SWEEP_EVERY_S)
                if celery is not None and celery.poll() is not None:
                    self.stderr.write(f"The Celery worker exited ({celery.returncode}): "
                                      f"reconcile jobs and notifications wait. See "
                                      f"{celery_log}.")
                    celery = None
                if supervising and supervisor.poll() is not None:
                    supervising = False
                    self.stderr.write(f"The demo supervisor exited ({supervisor.returncode}); "
                                      f"approved retries are no longer resumed by themselves. "
                                      f"See {supervisor_log}.")
            raise CommandError(f"the web server exited with status {server.returncode}; "
                               f"see {log_path}")
        except KeyboardInterrupt:
            self.stdout.write("\nStopping.")
        finally:
            # A second Ctrl-C or SIGTERM (make passes it on too) must not cut the clean-up.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for proc in reversed(children):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()

    def _reset_database(self) -> None:
        db = settings.DATABASES["default"]
        connections.close_all()
        if db["ENGINE"].endswith("sqlite3"):
            path = Path(db["NAME"])
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            self.stdout.write(f"Recreating {path}")
        else:
            self.stdout.write(f"Using DATABASE_URL's database {_where(db)} (it must be empty)")
        try:
            call_command("migrate", verbosity=0, interactive=False)
        except OperationalError as exc:
            raise CommandError(database_unreachable(db, exc)) from None
        self._refuse_filled_database()

    def _broker_connection(self):
        """A connection to ``CELERY_BROKER_URL``'s broker, or ``CommandError`` saying it
        does not answer (a URL kombu cannot read, an unknown scheme's ``KeyError``,
        included)."""
        try:
            conn = current_app.connection_for_write()
            conn.ensure_connection(max_retries=2)
        except Exception as exc:  # noqa: BLE001 - kombu's errors differ by transport
            raise CommandError(f"the broker in CELERY_BROKER_URL does not answer "
                               f"({type(exc).__name__}): is it up?") from None
        return conn

    def _purge_broker(self, conn=None) -> None:
        """Empty the broker's task queue before the demo's worker starts: a message left
        by a previous demo (its worker stopped, or killed, with jobs queued) names rows of
        the database just dropped, and the new worker ran it against this one (a
        newcomer's finding). ``control.purge`` empties the queue; with Redis, kombu's
        keys of delivered but unacknowledged messages (restored to the queue later) are
        deleted too, on the broker URL's own database only. The worker and beat are not
        running yet, so nothing of this demo is lost."""
        app = current_app
        conn = conn or self._broker_connection()
        with conn:
            purged = app.control.purge(connection=conn)
            channel = conn.default_channel
            unacked = [getattr(channel, k) for k in
                       ("unacked_key", "unacked_index_key", "unacked_mutex_key")
                       if hasattr(channel, k)]
            if unacked:  # kombu's Redis transport
                channel.client.delete(*unacked)
        self.stdout.write(f"Emptied the broker's task queue ({purged} message(s) of an "
                          "earlier run dropped).")

    def _refuse_filled_database(self) -> None:
        """Raise ``CommandError`` (one paragraph: what to do) when the database holds any
        tenant already (an earlier demo's, or a deployment's: stop 41's attack found a
        live database with tenants of its own taken, and its queue emptied): the demo
        fills an empty database, it never writes among another's rows."""
        held = list(Tenant.objects.order_by("slug").values_list("slug", flat=True)[:4])
        if held:
            db = settings.DATABASES["default"]
            named = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            raise CommandError(
                f"tenants already exist in {_where(db)} ({named}): a demo ran on it "
                f"before, or it is a deployment's, and the demo only fills an empty "
                f"database. "
                + (f"Delete that file (rm {db['NAME']}), point DATABASE_URL at another "
                   if db["ENGINE"].endswith("sqlite3") else
                   f"Drop and recreate it ({_createdb(db, drop=True)}), point DATABASE_URL "
                   f"at another ")
                + "empty database, or unset DATABASE_URL: the demo then uses the embedded "
                "SQLite file (var/recovery.sqlite3), which it recreates on every run.")

    def _start_celery(self, var_dir: Path, env: dict) -> tuple[subprocess.Popen, Path]:
        """Start ``celery -A recovery worker --beat`` (one process, its beat embedded:
        the demo runs one) with the web server's environment (the demo receiver's
        loopback http allowed, links to the web server), logging to
        ``var/demo-celery.log``; returns the process and the log's path."""
        log_path = var_dir / "demo-celery.log"
        schedule = var_dir / "demo-celerybeat-schedule"
        for stale in var_dir.glob(f"{schedule.name}*"):
            stale.unlink(missing_ok=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "recovery", "worker", "--beat",
                 "--schedule", str(schedule), "--concurrency", "1", "--loglevel", "INFO"],
                cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.stdout.write(f"CELERY_BROKER_URL is set: started a Celery worker with beat "
                          f"(log: {log_path}).")
        return proc, log_path

    def _create_tenants(self) -> dict[str, str]:
        """Tenants, accounts and roles through the services; returns writer tokens (the
        accounts by username in ``self.accounts``)."""
        tokens: dict[str, str] = {}
        self.accounts = {}
        for slug, name in TENANTS.items():
            tenant = services.tenant_create(slug=slug, name=name)
            services.tenant_set_ambiguity_threshold(actor=None, tenant=tenant,
                                                    seconds=THRESHOLD_S)
            # Declared before any run is written, so legal holds and erasure requests by
            # subject can be tried on the demo's runs (README "Demo"; the stop-36
            # newcomer found no subject field declared and nothing to hold by value).
            services.data_policy_set(actor=None, tenant=tenant,
                                     subject_fields=DEMO_SUBJECT_FIELDS)
            for suffix, role in ACCOUNTS:
                service = role == Role.WRITER
                user = services.account_create(username=f"{slug}-{suffix}",
                                               password=None if service else PASSWORD,
                                               service=service)
                services.role_grant(actor=None, tenant=tenant, user=user, role=role)
                self.accounts[user.get_username()] = user
                if service:
                    tokens[slug] = services.token_issue(user=user)
        return tokens

    def _webhook_endpoint(self, url: str) -> str:
        """acme's webhook endpoint to the demo receiver (every event type, a
        ``DEMO_WINDOW_S`` grouping window), created by ``acme-admin`` through the endpoint
        service (``services.endpoint_create``: validated, audited). The receiver's URL is
        plain http on loopback, which the operator allows here as the web server's
        environment does (``DEMO_NOTIFY_ENV``). Returns the signing secret (``whsec_…``),
        which the service shows this once."""
        tenant = Tenant.objects.get(slug="acme")
        with override_settings(RECOVERY_NOTIFY_ALLOW_PRIVATE=True,
                               RECOVERY_NOTIFY_ALLOW_HTTP=True):
            _endpoint, secret = services.endpoint_create(
                actor=self.accounts["acme-admin"], tenant=tenant,
                body={"channel": NotificationChannel.WEBHOOK, "name": "demo receiver",
                      "url": url, "event_types": list(NotificationEventType.SUBSCRIBABLE),
                      "group_window_s": DEMO_WINDOW_S})
        return secret

    def _strand(self, units) -> list[tuple[str, str]]:
        """The stranded v1 runs (``orchestrate.STRANDED`` units whose worker died as
        planned, after its in-flight checkpoint, now ``ambiguous``): a retry requested by
        the tenant's reviewer and approved by its approver, through the services (audited
        as theirs), as a team would have done before upgrading to ``acme.order`` v2. The
        supervisor then tries them, and is answered ``migration_required``. Returns
        ``[(tenant, run id)]``; a unit whose worker did otherwise is left as it is."""
        stranded = []
        for unit in units:
            if unit.label != STRANDED or [r.get("outcome") for r in unit.results] != [
                    "killed after_intent"]:
                continue
            argv = unit.commands[0]
            run_id = argv[argv.index("--run-id") + 1]
            tenant = Tenant.objects.get(slug=unit.tenant)
            reviewer = self.accounts[f"{unit.tenant}-reviewer"]
            approver = self.accounts[f"{unit.tenant}-approver"]
            retry = services.retry_request(
                actor=reviewer, tenant=tenant, run_id=uuid.UUID(run_id),
                reason="the order's worker died; finish the charge (before the upgrade to "
                       "acme.order v2)")
            services.retry_approve(actor=approver, tenant=tenant, retry_id=retry.pk,
                                   reason="nothing was charged: safe to retry")
            stranded.append((unit.tenant, run_id))
        return stranded

    def _summary(self, tally, swept, base_url, payments_url, seed, elapsed, log_path,
                 supervisor_log, stranded=()) -> None:
        w = self.stdout.write
        w("")
        w(self.style.SUCCESS(f"Demo ready in {elapsed:.0f} s (seed {seed})."))
        w("Worker processes: " + ", ".join(f"{k}: {v}" for k, v in sorted(tally.items())))
        w(f"The sweep just now marked {swept['runs_ambiguous']} more run(s) ambiguous and "
          f"{swept['effects_unresolved']} effect(s) unresolved; runs per state:")
        w("")
        for slug in TENANTS:
            counts = selectors.state_counts(tenant=Tenant.objects.get(slug=slug))
            shown = ", ".join(f"{state} {n}" for state, n in counts.items() if n)
            w(f"  {slug:8} runs: {shown or 'none'}")
        w("")
        for slug, run_id in stranded:
            w(f"Stranded v1 run:  {slug} {run_id}   (acme.order v1, retry approved; the "
              f"server migrates acme.order offline, so its resume answers "
              f"migration_required until an admin migrates it: the Kinds page's Migrate to "
              f"v2, or python manage.py migrate_checkpoints acme.order --to 2 --tenant "
              f"{slug} --run {run_id})")
        if stranded:
            w("")
        w(f"Dashboard:        {base_url}/")
        w(f"API schema:       {base_url}/api/schema/")
        w(f"Payment service:  {payments_url}/charges   (status: {payments_url}/operations/KEY)")
        w(f"Server log:       {log_path}")
        receiver_url, receiver_log = getattr(self, "receiver", ("", ""))
        if receiver_url:
            w(f"Webhook receiver: {receiver_url}/   (acme's signed messages, whether each "
              f"signature verifies; log: {receiver_log})")
        if supervisor_log is not None:
            w(f"Supervisor log:   {supervisor_log}   (resumes runs whose retry was approved)")
        w("")
        w(f"Logins (password for every person: {PASSWORD}):")
        for slug in TENANTS:
            people = [f"{slug}-{suffix} ({role})" for suffix, role in ACCOUNTS
                      if role != Role.WRITER]
            w(f"  {slug:8} " + ", ".join(people))
        w(f"  ({'/'.join(f'{s}-writer' for s in TENANTS)} are service accounts: API tokens only)")
        w("")
