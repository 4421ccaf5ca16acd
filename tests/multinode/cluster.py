"""The pieces of docs/scaling.md's "Two nodes on one machine", started on loopback for
tests/multinode (issue 22, item 4): a PostgreSQL cluster of its own (``initdb``), a
streaming replica of it (``pg_basebackup`` into a temporary directory, its own port),
PgBouncer in transaction pooling mode, gunicorn nodes, Celery workers and beat.

Every port is picked free at run time, every file lives under the test's temporary
directory, and ``Cluster.stop`` kills every process this module started (each in a
process group of its own, killed by its id). PostgreSQL and PgBouncer refuse to run as
root: as root they run as the ``postgres`` account.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None, log: Path, what: str,
              timeout: float = 60) -> None:
    """Wait until ``port`` accepts a connection; raise with the log's tail when ``proc``
    exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"{what} did not start on port {port}:\n{tail}") from None
            time.sleep(0.2)


def pg_bin(name: str) -> str:
    """The newest installed PostgreSQL's ``name`` (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return found[-1]
    return shutil.which(name) or name


def as_postgres() -> dict:
    """``Popen`` keywords running a server as the ``postgres`` account when we are root."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")
    return {"user": account.pw_uid, "group": account.pw_gid}


def own(path: Path) -> None:
    """Give ``path`` to the account the servers run as (root only)."""
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(path, account.pw_uid, account.pw_gid)


@dataclass
class Proc:
    """A started process (its own process group) and its log."""

    name: str
    argv: list[str]
    env: dict
    log: Path
    port: int | None = None
    popen_kw: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> Proc:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         **self.popen_kw)
        if self.port:
            wait_port(self.port, self.proc, self.log, self.name, timeout)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to this process's group (its children too), by its id."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the process and its children (a machine losing power, for them)."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; the group's leftovers too."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def primary_settings(admin_url: str) -> dict[str, str]:
    """The primary's settings a hot standby must match or exceed."""
    import psycopg

    names = ("max_connections", "max_worker_processes", "max_wal_senders",
             "max_prepared_transactions", "max_locks_per_transaction")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}


HBA = ("local all all trust\nhost all all 127.0.0.1/32 trust\n"
       "host replication all 127.0.0.1/32 trust\n")


def start_primary(tmp: Path, *, user: str = "postgres") -> Proc:
    """A PostgreSQL cluster of the test's own (``initdb`` into ``tmp/primary``, a free
    port, trusting loopback, replication allowed), started with ``postgres -D`` in the
    foreground: the streaming replica copies it, so its size (not the machine's main
    cluster's, which other suites fill) sets how long the copy takes."""
    data, sockets = tmp / "primary", tmp / "sockets"
    for d in (tmp, sockets):
        d.mkdir(exist_ok=True)
        own(d)
    done = subprocess.run([pg_bin("initdb"), "-D", str(data), "-U", user, "--auth=trust",
                           "-E", "UTF8", "--locale=C.UTF-8"],
                          capture_output=True, text=True, timeout=300, **as_postgres())
    if done.returncode:
        raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
    port = free_port()
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"\nport = {port}\nlisten_addresses = '127.0.0.1'\n"
                   f"unix_socket_directories = '{sockets}'\nwal_level = replica\n"
                   "max_wal_senders = 5\nmax_connections = 100\nshared_buffers = 64MB\n"
                   "timezone = 'UTC'\nlogging_collector = off\n")
    (data / "pg_hba.conf").write_text(HBA)
    log = tmp / "primary.log"
    log.touch()
    own(log)
    proc = Proc("primary", [pg_bin("postgres"), "-D", str(data)], dict(os.environ), log,
                port=port, popen_kw=as_postgres())
    proc.start(timeout=120)
    wait_accepting(f"postgres://{user}@127.0.0.1:{port}/postgres", proc)
    return proc


def start_replica(tmp: Path, *, host: str, port: int, user: str, admin_url: str) -> Proc:
    """A hot standby of the cluster at ``host:port``: ``pg_basebackup -R`` (streaming WAL
    during the copy, then ``primary_conninfo`` and ``standby.signal``) into ``tmp/replica``,
    its own configuration (port, socket directory, the primary's limits), started with
    ``postgres -D`` in the foreground. Returns the started ``Proc`` (``port`` set)."""
    data = tmp / "replica"
    sockets = tmp / "sockets"
    for d in (tmp, sockets):
        d.mkdir(exist_ok=True)
        own(d)
    log = tmp / "replica.log"
    log.touch()
    own(log)
    done = subprocess.run(
        [pg_bin("pg_basebackup"), "-h", host, "-p", str(port), "-U", user, "-D", str(data),
         "-R", "-X", "stream", "-c", "fast"],
        capture_output=True, text=True, timeout=300, **as_postgres())
    if done.returncode:
        raise RuntimeError(f"pg_basebackup failed:\n{done.stdout}\n{done.stderr}")
    replica_port = free_port()
    limits = primary_settings(admin_url)
    conf = [f"port = {replica_port}", "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{sockets}'", "hot_standby = on",
            "hot_standby_feedback = on", "shared_buffers = 32MB", "fsync = off",
            "logging_collector = off"]
    conf += [f"{name} = {value}" for name, value in limits.items()]
    # Debian keeps these in /etc/postgresql (not copied); elsewhere the copies are the
    # primary's (its port): ours replace them.
    for name, text in (("postgresql.conf", "\n".join(conf) + "\n"),
                       ("pg_hba.conf", HBA),
                       ("pg_ident.conf", "")):
        (data / name).write_text(text)
        own(data / name)
    (data / "postmaster.opts").unlink(missing_ok=True)
    proc = Proc("replica", [pg_bin("postgres"), "-D", str(data)], dict(os.environ), log,
                port=replica_port, popen_kw=as_postgres())
    proc.start(timeout=120)
    wait_accepting(f"postgres://{user}@127.0.0.1:{replica_port}/postgres", proc)
    return proc


def wait_accepting(url: str, proc: Proc, timeout: float = 120) -> None:
    """Wait until the server at ``url`` accepts a session (a standby: once consistent)."""
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} does not accept sessions:\n"
                                   f"{proc.log.read_text(errors='replace')[-3000:]}") from None
            time.sleep(0.3)


def start_pgbouncer(tmp: Path, *, dbname: str, host: str, port: int, user: str) -> Proc:
    """PgBouncer on a free port in transaction pooling mode, with one database ``dbname``
    (the primary's), trusting loopback (as the test cluster does)."""
    d = tmp / "pgbouncer"
    d.mkdir(exist_ok=True)
    own(d)
    listen = free_port()
    (d / "userlist.txt").write_text(f'"{user}" ""\n')
    (d / "pgbouncer.ini").write_text(f"""[databases]
{dbname} = host={host} port={port} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir = {d}
auth_type = trust
auth_file = {d / "userlist.txt"}
pool_mode = transaction
max_client_conn = 400
default_pool_size = 12
reserve_pool_size = 4
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
admin_users = {user}
""")
    for f in ("userlist.txt", "pgbouncer.ini"):
        own(d / f)
    log = d / "pgbouncer.log"
    log.touch()
    own(log)
    proc = Proc("pgbouncer", [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer",
                              str(d / "pgbouncer.ini")], dict(os.environ), log, port=listen,
                popen_kw=as_postgres())
    return proc.start()


def manage(env: dict, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    """``manage.py args`` with ``env``; raises with its output when it fails."""
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def gunicorn(name: str, env: dict, tmp: Path, port: int | None = None) -> Proc:
    """A web node: ``gunicorn recovery.wsgi`` (gunicorn.conf.py) on ``port`` (free if
    None), with its own Prometheus directory."""
    port = port or free_port()
    node_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(tmp / f"prom-{name}")}
    return Proc(name, [sys.executable, "-m", "gunicorn", "recovery.wsgi", "--bind",
                       f"127.0.0.1:{port}"], node_env, tmp / f"{name}.log", port=port)


def celery_worker(name: str, env: dict, tmp: Path) -> Proc:
    """A Celery worker (solo pool: one process, so SIGKILL takes the whole worker)."""
    return Proc(name, [sys.executable, "-m", "celery", "-A", "recovery", "worker",
                       "--pool=solo", "--loglevel=INFO", "--without-gossip",
                       "--without-mingle", "-n", f"{name}@%h"], env, tmp / f"{name}.log")


def celery_beat(env: dict, tmp: Path) -> Proc:
    """The one Celery beat (its schedule file in ``tmp``)."""
    return Proc("beat", [sys.executable, "-m", "celery", "-A", "recovery", "beat",
                         "--loglevel=INFO", "-s", str(tmp / "beat-schedule")], env,
                tmp / "beat.log")


def wait_log(proc: Proc, text: str, timeout: float = 60) -> None:
    """Wait until ``text`` is in ``proc``'s log; raise with its tail when not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in proc.log.read_text(errors="replace"):
            return
        if not proc.alive():
            break
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name}: {text!r} not in its log:\n"
                       f"{proc.log.read_text(errors='replace')[-3000:]}")
