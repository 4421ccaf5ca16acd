"""Settings, read from the environment (CONTRACT.md section 7).

Every variable is optional: with nothing set the service runs on an embedded SQLite file
under ``var/`` with Celery tasks executed in-process, and prints a loud warning for each
development default it falls back to. Bad values raise ``ImproperlyConfigured``.
A variable ``NAME_FILE`` is read as the value of ``NAME`` (container secrets).
"""

import os
import re
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import dj_database_url
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django_guid.integrations import CeleryIntegration

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RECOVERY_VAR_DIR", BASE_DIR / "var"))


def env(name: str, default: str | None = None) -> str | None:
    """Return ``$NAME``, else the contents of the file named by ``$NAME_FILE``, else default."""
    if name in os.environ:
        return os.environ[name]
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return default


def env_bool(name: str, default: bool) -> bool:
    """``0``/``1`` (also false/true, no/yes); anything else raises ImproperlyConfigured."""
    raw = env(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be 0 or 1, not {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """An integer >= minimum; anything else raises ImproperlyConfigured."""
    raw = env(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from exc
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, not {value}")
    return value


#: Settings that fell back to a development value (a deploy check reports each one).
RECOVERY_DEV_DEFAULTS: list[str] = []


def _dev_default(name: str, value: str) -> str:
    RECOVERY_DEV_DEFAULTS.append(name)
    if "pytest" not in sys.modules:
        warnings.warn(
            f"\n*** {name} is not set: using an insecure DEVELOPMENT value. "
            f"Set {name} before running this anywhere real. ***\n",
            RuntimeWarning,
            stacklevel=2,
        )
    return value


SECRET_KEY = env("SECRET_KEY") or _dev_default(
    # The django-insecure- prefix makes `check --deploy` report it (security.W009).
    "SECRET_KEY", "django-insecure-dev-0c6b1f0e-recovery-secret-key-change-me"
)
DEBUG = env_bool("DEBUG", default="SECRET_KEY" not in os.environ)
ALLOWED_HOSTS = [
    h.strip() for h in (env("ALLOWED_HOSTS") or "localhost,127.0.0.1,[::1]").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in (env("CSRF_TRUSTED_ORIGINS") or "").split(",") if o.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from a pinned package, not a CDN
    "guardian",
    "django_htmx",
    "template_partials",
    "axes",
    "csp",
    "django_prometheus",  # /metrics: request and database metrics (checkpoints.ops.health)
    "django_guid",  # the request id (X-Request-ID) on every log line and response
    "checkpoints",
]

MIDDLEWARE = [
    # First: validate X-Request-ID (checkpoints.ops.health), then django-guid sets the request id
    # for every log line, echoes it and hands it to Celery tasks; then start the clock.
    "checkpoints.ops.health.RequestIdMiddleware",
    "django_guid.middleware.guid_middleware",
    # The database time a page's "3 min ago" words are measured against (one per request).
    "checkpoints.dbclock.PageClockMiddleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (hashed, compressed, cached for a year) before anything per-request.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_permissions_policy.PermissionsPolicyMiddleware",
    "checkpoints.ops.security.PrivateNoStoreMiddleware",
    "checkpoints.ops.security.LoginSlotsMiddleware",
    # Just outside the sessions middleware: its cookie deleted with HttpOnly and Secure too.
    "checkpoints.ops.security.SessionCookieDeletionMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "checkpoints.jobs.inprocess.InProcessWorkerMiddleware",
    "axes.middleware.AxesMiddleware",  # last of the project's (django-axes docs)
    "django_prometheus.middleware.PrometheusAfterMiddleware",  # last (its docs)
]

ROOT_URLCONF = "recovery.urls"
WSGI_APPLICATION = "recovery.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "checkpoints.dashboard.context_processors.background",
            ],
        },
    }
]

# --- Database -------------------------------------------------------------------------
DATABASE_URL = env("DATABASE_URL")
# Issue 8: on PostgreSQL a checkpoint update and an audit append take the SQL write path
# (checkpoints/services/writepath.py); off, they take the ORM path, the reference it is tested
# against (tests/services/test_writepath.py). Only for diagnosis.
RECOVERY_SQL_WRITE_PATH = env_bool("RECOVERY_SQL_WRITE_PATH", True)

# Persistent connections: a web thread keeps its database connection for this many
# seconds (0: a new connection per request, as Django's default; opening one costs a
# PostgreSQL backend start and authentication, several ms). Each gunicorn thread holds at
# most one, so a machine holds WEB_CONCURRENCY x GUNICORN_THREADS of them (gunicorn.conf.py;
# docs/scaling.md for pgbouncer). A connection is checked (``SELECT 1``) before its first
# use in each request and reopened if the database dropped it (``CONN_HEALTH_CHECKS``), so
# a database restart costs no failed request. Celery workers close theirs around every
# task whatever this says (celery.fixups.django), and the in-process worker thread after
# every round (checkpoints.jobs.inprocess).
RECOVERY_DB_CONN_MAX_AGE = env_int("RECOVERY_DB_CONN_MAX_AGE", 60)
# DESIGN.md section 6: concurrent writers of one SQLite file queue instead of failing
# ("database is locked"), the embedded default's and a ``sqlite:///`` DATABASE_URL's alike.
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=RECOVERY_DB_CONN_MAX_AGE, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS,
                                           **DATABASES["default"].get("OPTIONS", {})}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env("RECOVERY_SQLITE_PATH") or str(VAR_DIR / "recovery.sqlite3"),
            "OPTIONS": dict(SQLITE_OPTIONS),
            "TEST": {"NAME": str(VAR_DIR / "test-recovery.sqlite3")},
            "CONN_MAX_AGE": RECOVERY_DB_CONN_MAX_AGE,
            "CONN_HEALTH_CHECKS": True,
        }
    }
# Issue 22, item 4 (docs/scaling.md "PgBouncer"): DATABASE_URL points at PgBouncer in
# transaction pooling mode. psycopg then never prepares a statement on the server
# (``prepare_threshold`` None: PgBouncer before 1.21, Debian bookworm's 1.18, hands the next
# transaction another server connection, where the prepared name does not exist), Django
# opens no server-side cursor (``.iterator()``: its cursor would outlive the transaction),
# and ``locks.try_session_lock`` holds a transaction-level advisory lock on a connection
# of its own instead of a session lock (which would stay on whichever server connection
# took it). Also ``?pgbouncer=1`` on DATABASE_URL (the option is removed from what
# psycopg is given).
RECOVERY_PGBOUNCER = env_bool("RECOVERY_PGBOUNCER", False)


def _pgbouncer_option(options: dict, where: str) -> bool | None:
    """The ``pgbouncer`` query option of a database URL, removed from what psycopg is
    given (it would refuse it): True/False for 1/0 (also true/false, yes/no, on/off, any
    case), None when absent; anything else raises ImproperlyConfigured (an attack's
    finding: ``?pgbouncer=0`` reached psycopg and every connection failed)."""
    raw = options.pop("pgbouncer", None)
    if raw is None:
        return None
    value = str(raw).strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{where}: pgbouncer must be 0 or 1, not {raw!r}")


if DATABASE_URL and _pgbouncer_option(DATABASES["default"].setdefault("OPTIONS", {}), "DATABASE_URL"):
    RECOVERY_PGBOUNCER = True
# Issue 22, item 4 (docs/scaling.md "Read replica"): a streaming replica of the primary,
# parsed like DATABASE_URL. The inbox, its polls, the report and the API's run list and
# report read from it (``checkpoints.replica``: an explicit block, never inside a
# transaction); everything else, writes first, stays on the primary. /readyz fails
# (``replica``) when it cannot answer or lags more than RECOVERY_REPLICA_MAX_LAG_S seconds,
# and the reads it would serve then go to the primary.
RECOVERY_REPLICA_URL = env("RECOVERY_REPLICA_URL")
RECOVERY_REPLICA_MAX_LAG_S = env_int("RECOVERY_REPLICA_MAX_LAG_S", 30, minimum=1)
if RECOVERY_REPLICA_URL:
    if not DATABASE_URL:
        raise ImproperlyConfigured("RECOVERY_REPLICA_URL needs DATABASE_URL (a PostgreSQL "
                                   "primary; the embedded SQLite default has no replica)")
    DATABASES["replica"] = dj_database_url.parse(
        RECOVERY_REPLICA_URL, conn_max_age=RECOVERY_DB_CONN_MAX_AGE, conn_health_checks=True)
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    if _pgbouncer_option(DATABASES["replica"].setdefault("OPTIONS", {}),
                         "RECOVERY_REPLICA_URL"):
        RECOVERY_PGBOUNCER = True
    DATABASE_ROUTERS = ["checkpoints.replica.ReplicaRouter"]
for _alias in DATABASES:
    if DATABASES[_alias]["ENGINE"].endswith("postgresql"):
        _options = DATABASES[_alias].setdefault("OPTIONS", {})
        if RECOVERY_PGBOUNCER:
            _options["prepare_threshold"] = None
            DATABASES[_alias]["DISABLE_SERVER_SIDE_CURSORS"] = True
        else:
            # Straight to PostgreSQL: a statement of the store's own SQL (``checkpoints.sql``
            # cursors, the only server-binding ones; Django's own bind on the client and
            # never prepare) is prepared on its 5th run on a connection, psycopg's default
            # (Django turns it off for poolers): the checkpoint update is then neither
            # parsed nor planned again (issue 22, item 2; about 0.2 ms a write).
            _options.setdefault("prepare_threshold", 5)
# django-prometheus' database backends (the same Django backends, counting connections,
# queries, errors and query time for /metrics). RECOVERY_DB_METRICS=0 uses Django's own.
RECOVERY_DB_METRICS = env_bool("RECOVERY_DB_METRICS", True)
for _alias in DATABASES:
    _engine = DATABASES[_alias]["ENGINE"]
    if RECOVERY_DB_METRICS and _engine.startswith("django.db.backends."):
        DATABASES[_alias]["ENGINE"] = ("django_prometheus.db.backends."
                                       + _engine.rsplit(".", 1)[1])
# PostgreSQL: the engine above, wrapped so that the per-request health check costs no
# round trip while a kept connection is quiet (recovery/dbbackend/postgresql/base.py,
# issue 22 item 3); RECOVERY_DB_QUIET_CHECK=0 keeps Django's SELECT 1 on every request.
# The replica (RECOVERY_REPLICA_URL) has the same engine as the primary, so one base.
RECOVERY_DB_QUIET_CHECK = env_bool("RECOVERY_DB_QUIET_CHECK", True)
if DATABASES["default"]["ENGINE"].endswith(".postgresql"):
    RECOVERY_DB_BASE_ENGINE = DATABASES["default"]["ENGINE"]
    for _alias in DATABASES:
        if DATABASES[_alias]["ENGINE"] == RECOVERY_DB_BASE_ENGINE:
            DATABASES[_alias]["ENGINE"] = "recovery.dbbackend.postgresql"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: a locked-out username or address is refused before any password is hashed.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row
GUARDIAN_MONKEY_PATCH_USER = False

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "inbox"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("RECOVERY_STATIC_ROOT") or VAR_DIR / "staticfiles")
# Production (README "Production"): `manage.py collectstatic` writes hashed, compressed
# copies to STATIC_ROOT and WhiteNoiseMiddleware serves them (far-future cache headers,
# gzip). Hashed names need the manifest collectstatic writes, so the manifest storage is
# the default only with DEBUG off, outside the test runner; RECOVERY_STATIC_MANIFEST=0/1
# overrides. With DEBUG on, whitenoise serves the source files (no collectstatic).
RECOVERY_STATIC_MANIFEST = env_bool("RECOVERY_STATIC_MANIFEST",
                                    not DEBUG and "pytest" not in sys.modules)
if not RECOVERY_STATIC_MANIFEST:  # whitenoise warns about a missing STATIC_ROOT
    try:
        STATIC_ROOT.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
                    if RECOVERY_STATIC_MANIFEST
                    else "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# --- Security: logins, passwords, headers, deployment (docs/security/hardening.md) ----
# Every password set anywhere (create_account, the admin, changepassword) is checked.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": env_int("RECOVERY_PASSWORD_MIN_LENGTH", 12, minimum=8)}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes: after AXES_FAILURE_LIMIT failed logins for one username (from anywhere), or
# from one address (for any usernames), logins for it are refused (429, lockout page)
# without hashing the password, until the cool-off has passed since the last counted
# failure. `manage.py axes_reset_username NAME` / `axes_reset_ip ADDR` unlock by hand.
AXES_FAILURE_LIMIT = env_int("RECOVERY_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("RECOVERY_LOGIN_COOLOFF_S", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A refused attempt during the lockout is not recorded: it costs reads only, and cannot
# grow the attempt row (axes appends each attempt's form data to it).
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "checkpoints.ops.security.client_ip"
AXES_USERNAME_CALLABLE = "checkpoints.ops.security.login_username"
# Reverse proxies in front of the service that append to X-Forwarded-For (0: none, the
# peer address is the client's).
RECOVERY_TRUSTED_PROXY_COUNT = env_int("RECOVERY_TRUSTED_PROXY_COUNT", 0)
AXES_ENABLE_ADMIN = False  # the admin writes nothing (DESIGN.md 5); unlock by command
# Login slots (checkpoints.ops.security.LoginSlotsMiddleware): at most this many login POSTs
# hash passwords at once on this machine; one that waits longer than the wait gets 429.
RECOVERY_LOGIN_SLOTS = env_int("RECOVERY_LOGIN_SLOTS", max(1, (os.cpu_count() or 2) // 2),
                               minimum=1)
RECOVERY_LOGIN_SLOT_WAIT_MS = env_int("RECOVERY_LOGIN_SLOT_WAIT_MS", 1000)
RECOVERY_LOGIN_SLOT_DIR = env("RECOVERY_LOGIN_SLOT_DIR") or str(VAR_DIR / "login-slots")

# Content-Security-Policy (django-csp) on every response: scripts and styles only from
# our own static files (no inline code, no eval), nothing framed, forms post to us only.
_CSP_REPORT_URI = env("RECOVERY_CSP_REPORT_URI") or ""
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'none'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "manifest-src": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'none'"],
        "object-src": ["'none'"],
        **({"report-uri": [_CSP_REPORT_URI]} if _CSP_REPORT_URI else {}),
    },
}
PERMISSIONS_POLICY = {feature: [] for feature in (
    "accelerometer", "camera", "geolocation", "gyroscope", "magnetometer", "microphone",
    "payment", "usb", "browsing-topics")}
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
CSRF_COOKIE_HTTPONLY = True  # htmx sends the token from the page (hx-headers), not the cookie
# Flash messages: Django's cookie-then-session storage, whose cookie is deleted with the
# attributes it was set with (HttpOnly, Secure, SameSite; checkpoints.ops.security).
MESSAGE_STORAGE = "checkpoints.ops.security.MessageStorage"
# A stale token (logout/login in another tab) answers a short message in place for htmx,
# a readable page otherwise, never Django's error page inside the run page (issue 9).
CSRF_FAILURE_VIEW = "checkpoints.dashboard.errors.csrf_failure"
# Deployment: secure by default when DEBUG is off; each may be turned off from the
# environment (e.g. TLS ends at a proxy that already redirects), and the check it then
# raises silenced with RECOVERY_SILENCED_CHECKS=security.W008,...
_SECURE = not DEBUG
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _SECURE)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if _SECURE else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", _SECURE)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", _SECURE)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _SECURE)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _SECURE)
# Behind a TLS-terminating proxy: SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https
_proxy_ssl = (env("SECURE_PROXY_SSL_HEADER") or "").split(",")
if len(_proxy_ssl) == 2 and all(part.strip() for part in _proxy_ssl):
    SECURE_PROXY_SSL_HEADER = (_proxy_ssl[0].strip(), _proxy_ssl[1].strip())
elif _proxy_ssl != [""]:
    raise ImproperlyConfigured("SECURE_PROXY_SSL_HEADER must be HEADER,value, e.g. "
                               "HTTP_X_FORWARDED_PROTO,https")
# Probes and Prometheus reach a node directly, often over plain http inside the network:
# /healthz, /readyz and /metrics answer there instead of redirecting to https.
SECURE_REDIRECT_EXEMPT = [r"^(healthz|readyz|metrics)$"]
SILENCED_SYSTEM_CHECKS = [
    c.strip() for c in (env("RECOVERY_SILENCED_CHECKS") or "").split(",") if c.strip()
]
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # SQLite (the embedded default, or a ``sqlite:///`` DATABASE_URL): one covering index (RunTransition's resolutions,
    # ``include=["run"]``) is made there without its extra column, which only PostgreSQL
    # reads. Said on every migrate (models.W040) to every newcomer, it was a known
    # difference, not a fault (stop 33's newcomer).
    SILENCED_SYSTEM_CHECKS.append("models.W040")

# --- Bodies and payloads (CONTRACT.md section 6) ---------------------------------------
RECOVERY_MAX_BODY_BYTES = env_int("RECOVERY_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)
RECOVERY_MAX_JSON_DEPTH = env_int("RECOVERY_MAX_JSON_DEPTH", 64, minimum=2)
# Files an operator command reads (import_runifold, verify_audit_chain --against; issue
# 17): at most this many bytes and lines, checked before anything is written
# (checkpoints/ops/operatorfiles.py, docs/runifold.md).
RECOVERY_IMPORT_MAX_BYTES = env_int("RECOVERY_IMPORT_MAX_BYTES", 4 * 1024**3, minimum=1024)
RECOVERY_IMPORT_MAX_LINES = env_int("RECOVERY_IMPORT_MAX_LINES", 10_000_000, minimum=1)
# Django refuses bodies over this before our view sees them; keep it above our own limit
# so that the API can answer the contract's 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = RECOVERY_MAX_BODY_BYTES + 64 * 1024
# A body the application did not read (a 413, a 401 ...) is read and discarded up to this
# many bytes and seconds so that the kept-alive connection serves the next request;
# beyond either the answer says Connection: close (checkpoints/ops/keepalive.py).
RECOVERY_DRAIN_MAX_BYTES = env_int("RECOVERY_DRAIN_MAX_BYTES", 8 * 1024 * 1024, minimum=0)
RECOVERY_DRAIN_SECONDS = env_int("RECOVERY_DRAIN_SECONDS", 5, minimum=0)

# --- Encryption at rest ----------------------------------------------------------------
# Comma-separated Fernet keys, newest first; old keys still decrypt (rotation).
RECOVERY_ENCRYPTION_KEYS = [
    k.strip()
    for k in (
        env("RECOVERY_ENCRYPTION_KEYS")
        or _dev_default(
            "RECOVERY_ENCRYPTION_KEYS", "ZGV2LW9ubHkta2V5LXJlY292ZXJ5LTMyYnl0ZXMhISE="
        )
    ).split(",")
    if k.strip()
]


def _check_fernet_keys(keys: list[str]) -> None:
    """Refuse to start with a payload key that is not a Fernet key (32 url-safe base64
    bytes), instead of answering 500 to the first write: the process (runserver, gunicorn,
    a worker, any manage.py command) stops at once, saying how to make one."""
    if not keys:
        raise ImproperlyConfigured("RECOVERY_ENCRYPTION_KEYS is empty")
    for n, key in enumerate(keys, 1):
        try:
            Fernet(key.encode())
        except ValueError:
            raise ImproperlyConfigured(
                f"RECOVERY_ENCRYPTION_KEYS: key {n} of {len(keys)} is not a Fernet key (32 "
                "url-safe base64-encoded bytes). Make one with: python -c 'from "
                "cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
            ) from None


_check_fernet_keys(RECOVERY_ENCRYPTION_KEYS)
# These master keys wrap each tenant's data key (envelope encryption, issue 20;
# docs/security/encryption.md). A process keeps an unwrapped data key for at most this many
# seconds, so a key destroyed by another process (manage.py shred_tenant) is refused
# everywhere within this bound; 0 reads the key's row on every use.
RECOVERY_DATA_KEY_CACHE_S = env_int("RECOVERY_DATA_KEY_CACHE_S", 60, minimum=0)
# Audit chain HMAC keys (docs/security/audit.md): comma-separated secrets of at least 32
# characters, newest first. New events are keyed with the first; every listed key still
# verifies the events it signed, so keep old keys listed (rotation never rewrites history).
# The database never holds them.
RECOVERY_AUDIT_KEYS = [
    k.strip()
    for k in (
        env("RECOVERY_AUDIT_KEYS")
        or _dev_default("RECOVERY_AUDIT_KEYS", "dev-insecure-recovery-audit-key-change-me-00")
    ).split(",")
    if k.strip()
]

# --- Recovery policy --------------------------------------------------------------------
# How often the stale-run sweep (and the re-drive of reconcile requests) runs: Celery beat
# with a broker, the web process's in-process worker without one. A run whose owner is
# gone is listed ambiguous within about this long (DESIGN.md 4: "never staler than ~15 s").
RECOVERY_SWEEP_INTERVAL_S = env_int("RECOVERY_SWEEP_INTERVAL_S", 10, minimum=1)
# How often the retention purge applies the tenants' data policies (issue 20;
# docs/security/retention.md): Celery beat with a broker, the in-process worker without.
RECOVERY_RETENTION_INTERVAL_S = env_int("RECOVERY_RETENTION_INTERVAL_S", 3600, minimum=1)
# Notifications (docs/notifications.md, "Events and incidents"): links' base, aging, digest hour.
RECOVERY_PUBLIC_URL = (env("RECOVERY_PUBLIC_URL") or "http://127.0.0.1:8000").rstrip("/")
RECOVERY_NOTIFY_UNKNOWN_AGING_S = env_int("RECOVERY_NOTIFY_UNKNOWN_AGING_S", 86400, minimum=60)
RECOVERY_NOTIFY_DIGEST_HOUR = min(env_int("RECOVERY_NOTIFY_DIGEST_HOUR", 8), 23)  # UTC
RECOVERY_RECONCILE_TIMEOUT_S = env_int("RECOVERY_RECONCILE_TIMEOUT_S", 5, minimum=1)
# A look-up's "never saw the key" settles not_executed only this long after submitted
# (a call still in flight may not have reached the service yet).
RECOVERY_RECONCILE_SETTLE_DELAY_S = env_int("RECOVERY_RECONCILE_SETTLE_DELAY_S", 30)
# Look-ups in a row that cannot tell before a request gives up and waits for a human.
RECOVERY_RECONCILE_MAX_FAILURES = env_int("RECOVERY_RECONCILE_MAX_FAILURES", 6, minimum=1)
# Capped exponential back-off between look-ups that could not tell: base * 2^(n-1) <= max.
RECOVERY_RECONCILE_BACKOFF_S = env_int("RECOVERY_RECONCILE_BACKOFF_S", 5, minimum=1)
RECOVERY_RECONCILE_BACKOFF_MAX_S = env_int("RECOVERY_RECONCILE_BACKOFF_MAX_S", 300, minimum=1)
# With a broker: a queued request this overdue (its message lost, or never sent because
# the broker was down) is sent again by the sweep. Duplicates are harmless (claimed once).
RECOVERY_RECONCILE_REDRIVE_GRACE_S = env_int("RECOVERY_RECONCILE_REDRIVE_GRACE_S", 30)
# service name -> base URL of its status resource; GET {base}/{operation_key}
RECOVERY_RECONCILERS = {
    pair.split("=", 1)[0].strip(): pair.split("=", 1)[1].strip()
    for pair in (env("RECOVERY_RECONCILERS") or "").split(",")
    if "=" in pair
}

# --- Kinds ------------------------------------------------------------------------------
# The user's kind modules: dotted module names, comma-separated, each importable by the
# web and worker processes; each registers its kinds when imported, once, at start
# (checkpoints.apps; docs/kinds.md). A module that fails stops start-up.
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def _kind_modules(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for name in names:
        if not _MODULE_NAME.match(name):
            raise ImproperlyConfigured(
                f"RECOVERY_KIND_MODULES: {name!r} is not a dotted module name "
                "(e.g. examples.kinds.acme_refunds)")
    return list(dict.fromkeys(names))


RECOVERY_KIND_MODULES = _kind_modules(env("RECOVERY_KIND_MODULES") or "")


def _offline_kinds(raw: str) -> list[str]:
    """``RECOVERY_OFFLINE_KINDS``: kind names, comma-separated, blanks and repeats dropped.
    Whether each is a registered kind is checked at start (``apps.set_offline_kinds``),
    once the kind modules are loaded."""
    return list(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))


# Kinds that migrate offline (docs/migrations.md, "Lazy and offline kinds"): a run whose
# latest checkpoint is an older version of one of them is not resumed (reject /
# migration_required) until the operator migrates it. Registered kinds only (built in,
# or from RECOVERY_KIND_MODULES); an unknown one stops start-up. Default: every kind lazy.
RECOVERY_OFFLINE_KINDS = _offline_kinds(env("RECOVERY_OFFLINE_KINDS") or "")

# --- Celery -----------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL") or None
CELERY_TASK_ALWAYS_EAGER = CELERY_BROKER_URL is None
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND") or None
CELERY_TASK_ACKS_LATE = True
# A task whose worker process died is given back to the queue, not acknowledged.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A broker that is down answers fast: the reviewer is told "queued, will run when the
# worker is back" (the request is stored; the sweep sends it again) instead of waiting.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Issue 17, item 11: a worker keeps trying to reach the broker for as long as the outage
# lasts (Celery's default gives up after 100 tries, ~16 min, and the worker exits for good).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A reconcile job in flight when the broker goes away runs to its end (it claimed its
# request; its result is in the database): not cancelled. Its unacknowledged message comes
# back after visibility_timeout and finds the request done ("skipped"), and a request whose
# worker died is re-driven by the sweep. Set explicitly: Celery 6 changes the default.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0,
                                    "interval_step": 0.2, "interval_max": 0.5}
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 900, "socket_connect_timeout": 2,
                                   "socket_timeout": 5, "max_retries": 1}
# Without a broker the web process runs the sweep and due reconcile requests itself in a
# background thread (checkpoints.jobs.inprocess); off under the test runner (tests drive it).
RECOVERY_INPROCESS_WORKER = env_bool(
    "RECOVERY_INPROCESS_WORKER", CELERY_BROKER_URL is None and "pytest" not in sys.modules)
# With a broker, each web process watches the sweep's heartbeat and sweeps itself when no
# sweep finished in two intervals (beat or the broker down; checkpoints.jobs.inprocess.catch_up).
RECOVERY_SWEEP_WATCHDOG = env_bool("RECOVERY_SWEEP_WATCHDOG", "pytest" not in sys.modules)
# /readyz answers 503 naming `worker` when the deployment's background worker (Celery's
# sweep with a broker, else the in-process worker) last swept longer ago than this.
RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S = env_int("RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S",
                                              6 * RECOVERY_SWEEP_INTERVAL_S, minimum=1)
# --- Notifications (issue 21; docs/notifications.md) -----------------------------------
# How often the outbox is dispatched and due messages are sent: Celery beat with a broker,
# the in-process worker (and the web process's watchdog) without one.
RECOVERY_NOTIFY_INTERVAL_S = env_int("RECOVERY_NOTIFY_INTERVAL_S", 5, minimum=1)
# One delivery attempt's whole exchange (connect, send, answer): a 2xx within it delivers.
RECOVERY_NOTIFY_TIMEOUT_S = env_int("RECOVERY_NOTIFY_TIMEOUT_S", 10, minimum=1)
# Outbound requests to private, loopback, link-local... addresses are refused (SSRF)
# unless the operator allows them all (a demo or a test on one machine), or some networks
# (comma-separated CIDRs, e.g. "10.20.0.0/16,fd00:1::/64").
RECOVERY_NOTIFY_ALLOW_PRIVATE = env_bool("RECOVERY_NOTIFY_ALLOW_PRIVATE", False)
RECOVERY_NOTIFY_ALLOW_CIDRS = tuple(
    c.strip() for c in (env("RECOVERY_NOTIFY_ALLOW_CIDRS") or "").split(",") if c.strip())
# Endpoint URLs must be https unless this allows plain http.
RECOVERY_NOTIFY_ALLOW_HTTP = env_bool("RECOVERY_NOTIFY_ALLOW_HTTP", False)
# An endpoint failing without a single success for this long is disabled (5 days).
RECOVERY_NOTIFY_DISABLE_AFTER_S = env_int("RECOVERY_NOTIFY_DISABLE_AFTER_S", 5 * 86_400,
                                          minimum=60)
# One round sends for at most this long (then the next round goes on).
RECOVERY_NOTIFY_ROUND_BUDGET_S = env_int("RECOVERY_NOTIFY_ROUND_BUDGET_S", 30, minimum=1)
# /readyz names `notifications` when an outbox row, or a due message, waited this long.
RECOVERY_NOTIFY_STALE_S = env_int("RECOVERY_NOTIFY_STALE_S", 600, minimum=1)
# Email endpoints go through Django's mail backend: SMTP at EMAIL_HOST:EMAIL_PORT (STARTTLS
# with EMAIL_USE_TLS, implicit TLS with EMAIL_USE_SSL), from DEFAULT_FROM_EMAIL.
EMAIL_HOST = env("EMAIL_HOST") or "localhost"
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env("EMAIL_HOST_USER") or ""
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = RECOVERY_NOTIFY_TIMEOUT_S
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL") or "recovery@localhost"
# --- Audit sequencer (issue 22, item 1; docs/security/audit.md) ---------------------------
# How often queued audit events are integrated into each tenant's Merkle tree and a head
# signed: Celery beat with a broker, the in-process worker without one.
RECOVERY_AUDIT_INTEGRATE_INTERVAL_S = env_int("RECOVERY_AUDIT_INTEGRATE_INTERVAL_S", 1,
                                              minimum=1)
# /readyz fails ("audit") when the oldest queued event is older than this (seconds,
# database clock): the sequencer is not running.
RECOVERY_AUDIT_LAG_MAX_S = env_int("RECOVERY_AUDIT_LAG_MAX_S", 60, minimum=1)
# A periodic task beat sent and no worker took in time is dropped, not run late: with the
# worker down beat keeps sending (one audit task a second, ~86,000 a day), and without an
# expiry every one ran on restart. The work is idempotent and the next tick sends a fresh
# one, so a task older than twice its interval (30 s at least, for the 1 s ones) is
# skipped by the worker (Celery's ``expires``, an execution option of the entry; Redis
# keeps the message until a worker reads and discards it). The expiry is an absolute time
# of beat's clock judged on the worker's: 30 s leaves room for hosts whose clocks differ
# (the stop-39 attack: at 10 s, a worker 15 s ahead dropped every audit tick).
BEAT_EXPIRES_MIN_S = 30


def _beat(task: str, interval_s: int) -> dict:
    return {"task": task, "schedule": timedelta(seconds=interval_s),
            "options": {"expires": max(2 * interval_s, BEAT_EXPIRES_MIN_S)}}


CELERY_BEAT_SCHEDULE = {
    "audit-integrate": _beat("checkpoints.tasks.audit_integrate",
                             RECOVERY_AUDIT_INTEGRATE_INTERVAL_S),
    "stale-run-sweep": _beat("checkpoints.tasks.sweep_stale_runs", RECOVERY_SWEEP_INTERVAL_S),
    "retention-purge": _beat("checkpoints.tasks.retention_purge",
                             RECOVERY_RETENTION_INTERVAL_S),
    "notify": _beat("checkpoints.tasks.notify", RECOVERY_NOTIFY_INTERVAL_S),
}

# --- DRF --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "checkpoints.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "checkpoints.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "recovery API",
    "DESCRIPTION": "Checkpoint and effect store with compare-and-swap, leases, resume decisions "
    "and review actions. See CONTRACT.md.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and the docs page need an account (issue 6, docs/security/input.md).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Bulk actions' "action" and "state" are choice sets of their own (issue 9, item 3):
    # name them, and keep the names the resume answer's and the effect's sets had.
    "ENUM_NAME_OVERRIDES": {"BulkActionKindEnum": "checkpoints.vocab.BulkActionKind.values",
                            "BulkStateEnum": "checkpoints.vocab.BulkState.values",
                            "BulkOutcomeEnum": "checkpoints.vocab.BulkOutcome.values",
                            "MigrationOutcomeEnum": "checkpoints.vocab.MigrationOutcome.values",
                            "ActionEnum": "checkpoints.vocab.ResumeAction.values",
                            "StateEnum": "checkpoints.vocab.EffectState.values",
                            # 412 bodies: checkpoints' and LangGraph's (issue 10).
                            "ConflictWordEnum": ["conflict"]},
    # A nullable nested shape says "X or null" in OpenAPI 3.0.3 terms (checkpoints.api.schema).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "checkpoints.api.schema.nullable_refs",
                             "checkpoints.api.schema.head_operations"],
}

# --- Operations: metrics, request ids, logs (README "Production", checkpoints/ops/health.py) ----
# /metrics answers only `Authorization: Bearer <RECOVERY_METRICS_TOKEN>` (404 while unset).
RECOVERY_METRICS_TOKEN = env("RECOVERY_METRICS_TOKEN") or ""
# Several gunicorn workers: an empty directory shared by them, so one scrape sums every
# worker's counters (prometheus_client multiprocess mode; gunicorn.conf.py wipes it at
# start). Read by prometheus_client from the environment itself, so no NAME_FILE form.
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or ""
if PROMETHEUS_MULTIPROC_DIR:  # prometheus_client writes there from the first count on
    Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
PROMETHEUS_EXPORT_MIGRATIONS = False

DJANGO_GUID = {
    "GUID_HEADER_NAME": "X-Request-ID",
    "VALIDATE_GUID": False,  # checkpoints.ops.health.RequestIdMiddleware validates it first
    "UUID_FORMAT": "string",
    "EXPOSE_HEADER": False,  # no CORS here
    "INTEGRATIONS": [CeleryIntegration()],  # logging: recovery/celery.py
}

# One log line per record on stderr: JSON objects (python-json-logger) with
# RECOVERY_LOG_FORMAT=json, the default with DEBUG off; plain text with `text`, the
# default with DEBUG on (`make demo`). Each carries request_id (django-guid: the
# request's id, or the Celery task's, handed over from the request that sent it).
RECOVERY_LOG_FORMAT = env("RECOVERY_LOG_FORMAT") or ("text" if DEBUG else "json")
if RECOVERY_LOG_FORMAT not in ("json", "text"):
    raise ImproperlyConfigured(f"RECOVERY_LOG_FORMAT must be json or text, not "
                               f"{RECOVERY_LOG_FORMAT!r}")
LOG_LEVEL = env("LOG_LEVEL") or "WARNING"
# One line per request (method, path, status, duration_ms) on `recovery.access`, at INFO:
# on by default with DEBUG off (runserver prints its own with DEBUG on).
RECOVERY_ACCESS_LOG = env_bool("RECOVERY_ACCESS_LOG", not DEBUG)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "django_guid.log_filters.CorrelationId",
                               "correlation_id_field": "request_id"}},
    "formatters": {
        "json": {"()": "pythonjsonlogger.json.JsonFormatter",
                 "format": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
                 "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
                 "datefmt": "%Y-%m-%dT%H:%M:%S%z"},
        "text": {"format": "%(levelname)s %(name)s [%(request_id)s] %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["request_id"],
                             "formatter": RECOVERY_LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # Django's own "django" logger has a console handler too: let it go through root only,
    # so that each warning prints once.
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "recovery.access": {"level": "INFO" if RECOVERY_ACCESS_LOG else "WARNING"},
        # An ill-formed X-Request-ID is replaced, not worth a line of its own.
        "django_guid": {"level": "ERROR"},
    },
}

if "pytest" in sys.modules or env_bool("RECOVERY_FAST_HASHER", False):
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
