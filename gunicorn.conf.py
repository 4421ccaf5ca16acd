"""gunicorn settings, read by ``gunicorn recovery.wsgi`` run from this directory (or
``gunicorn -c /path/to/gunicorn.conf.py recovery.wsgi``).

Threaded workers: gunicorn's default is one synchronous worker, in which every request
waits behind any slow one, and a login is slow on purpose (password hashing). With
threads, API requests go on while a login hashes; ``RECOVERY_LOGIN_SLOTS`` bounds how
many logins hash at once (docs/security/hardening.md, bench/bench_login_starvation.py).
``WEB_CONCURRENCY`` (worker processes, default: the number of cores) and
``GUNICORN_THREADS`` (threads per worker, default 4) tune it; command-line options and
``GUNICORN_CMD_ARGS`` still override this file.

Connections: each thread keeps one database connection between requests
(``RECOVERY_DB_CONN_MAX_AGE``, recovery/settings.py), so a machine holds up to
``WEB_CONCURRENCY x GUNICORN_THREADS`` database connections (8 on two cores): keep
PostgreSQL's ``max_connections`` (or pgbouncer's pool) above the sum over web machines,
plus Celery workers. A client's HTTP connection is kept open between its requests for
``GUNICORN_KEEPALIVE`` seconds (default 5; gunicorn's own is 2): a runtime writing a
checkpoint every few seconds reuses its connection (``recovery_client.client``). Behind a
load balancer, set it above the balancer's idle timeout. An idle kept-alive connection
waits in the worker's poller, not in a thread; ``worker_connections`` (default 1000)
bounds them per worker.
"""

import os

worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY") or os.cpu_count() or 2)
threads = int(os.environ.get("GUNICORN_THREADS") or 4)
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE") or 5)

# Prometheus multiprocess mode (README "Production"): with PROMETHEUS_MULTIPROC_DIR set,
# every worker writes its counters to files there and a scrape of any worker sums them.
# The directory is emptied when the server starts (counts of a previous run would be
# added to this one's), and a worker's live gauges are dropped when it exits.
_multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def on_starting(server):
    if _multiproc_dir:
        os.makedirs(_multiproc_dir, exist_ok=True)
        for name in os.listdir(_multiproc_dir):
            if name.endswith(".db"):
                os.remove(os.path.join(_multiproc_dir, name))


def child_exit(server, worker):
    if _multiproc_dir:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
