"""gunicorn settings, read by ``gunicorn recovery.wsgi`` run from this directory (or
``gunicorn -c /path/to/gunicorn.conf.py recovery.wsgi``).

Threaded workers: gunicorn's default is one synchronous worker, in which every request
waits behind any slow one, and a login is slow on purpose (password hashing). With
threads, API requests go on while a login hashes; ``RECOVERY_LOGIN_SLOTS`` bounds how
many logins hash at once (docs/security/hardening.md, bench/bench_login_starvation.py).
``WEB_CONCURRENCY`` (worker processes, default: the number of cores) and
``GUNICORN_THREADS`` (threads per worker, default 4) tune it; command-line options and
``GUNICORN_CMD_ARGS`` still override this file.
"""

import os

worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY") or os.cpu_count() or 2)
threads = int(os.environ.get("GUNICORN_THREADS") or 4)
