"""The restore drill (issue 20, item 6; docs/operations/backup.md): prove that a backup of
the PostgreSQL database can be restored and served.

1. ``dump``: ``pg_dump --format=custom`` of the service's database (the binaries on
   ``PATH``; the same major version as the server, checked).
2. ``restore``: a fresh database (dropped first if it exists: never the service's own),
   ``pg_restore --no-owner --no-privileges`` into it.
3. ``check`` runs in a **new process** against the restored database, with the master
   keys, audit keys and ``SECRET_KEY`` this process has (the keys an operator keeps
   beside the backups, never in them): ``verify_audit_chain --against`` the exported
   heads; the keyring exported since, if given (``import_keyring``); then, as a drill
   account given the reviewer role in each tenant, the API: each tenant's run list and
   up to ``SAMPLE`` checkpoints (``GET …/checkpoints/{id}``: 200 with the payload, or 410
   ``erased`` for a tenant whose data keys are destroyed or cannot be unwrapped).
4. ``drill`` puts them together and judges: the chain holds, every tenant serves its
   payloads except those named ``erased``, which serve none.

Everything the check writes (the drill account, its role grants and reads, the keyring's
audit events) goes to the restored copy, which is dropped afterwards unless kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from checkpoints import services
from checkpoints.models import Checkpoint, Run, Tenant
from checkpoints.vocab import Role

#: How many checkpoints of each tenant the check reads through the API.
SAMPLE = 3
#: Seconds any one pg_dump, pg_restore or check may take.
STEP_TIMEOUT_S = 600


class DrillFailed(Exception):
    """A step of the drill failed; the message names it."""


def _pg() -> dict:
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        raise DrillFailed("the restore drill needs PostgreSQL (DATABASE_URL)")
    return {"host": s["HOST"] or "127.0.0.1", "port": str(s["PORT"] or 5432),
            "user": s["USER"] or "postgres", "password": s.get("PASSWORD") or "",
            "name": s["NAME"]}


def _env(pg: dict) -> dict:
    env = dict(os.environ)
    if pg["password"]:
        env["PGPASSWORD"] = pg["password"]
    return env


def _run(cmd: list[str], pg: dict, what: str) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=_env(pg),
                              timeout=STEP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DrillFailed(f"{what}: {exc}") from None
    if done.returncode != 0:
        raise DrillFailed(f"{what} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def _check_versions(pg: dict) -> None:
    with connection.cursor() as cur:
        cur.execute("SHOW server_version_num")
        server_major = int(cur.fetchone()[0]) // 10000
    out = _run(["pg_dump", "--version"], pg, "pg_dump --version").stdout
    found = re.search(r"(\d+)(?:\.\d+)?", out)
    if not found or int(found.group(1)) != server_major:
        raise DrillFailed(f"pg_dump is {out.strip()!r}; the server is PostgreSQL "
                          f"{server_major}: use the binaries of the server's major version")


def dump(path: str | Path) -> Path:
    """``pg_dump --format=custom`` of the service's database into ``path``."""
    pg = _pg()
    _check_versions(pg)
    _run(["pg_dump", "--format=custom", "--no-owner", "-h", pg["host"], "-p", pg["port"],
          "-U", pg["user"], "-f", str(path), pg["name"]], pg, "pg_dump")
    return Path(path)


def restore(path: str | Path, target: str) -> None:
    """Restore the dump at ``path`` into a fresh database ``target`` (dropped first if it
    exists). Refuses the service's own database."""
    pg = _pg()
    if not re.fullmatch(r"[A-Za-z0-9_]{1,63}", target) or target == pg["name"]:
        raise DrillFailed(f"target: {target!r} must be a plain name other than the "
                          f"service's database")
    with connection.cursor() as cur:  # CREATE/DROP DATABASE cannot run in a transaction
        if connection.in_atomic_block:
            raise DrillFailed("the restore drill cannot run inside a transaction")
        cur.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{target}"')
    _run(["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "-h", pg["host"],
          "-p", pg["port"], "-U", pg["user"], "-d", target, str(path)], pg, "pg_restore")


def drop(target: str) -> None:
    """Drop the restored copy."""
    if target == _pg()["name"]:
        raise DrillFailed("refusing to drop the service's database")
    with connection.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')


def check_in_new_process(target: str, *, heads: str | None, keyring: str | None) -> dict:
    """Run ``check`` (``manage.py restore_drill --check``) in a new process whose
    ``DATABASE_URL`` is the restored ``target``, with this process's keys. Returns its
    report."""
    pg = _pg()
    env = _env(pg)
    env.update({
        "DJANGO_SETTINGS_MODULE": "recovery.settings",
        "DATABASE_URL": (f"postgres://{quote(pg['user'])}:{quote(pg['password'])}"
                         f"@{pg['host']}:{pg['port']}/{target}"),
        "RECOVERY_ENCRYPTION_KEYS": ",".join(settings.RECOVERY_ENCRYPTION_KEYS),
        "RECOVERY_AUDIT_KEYS": ",".join(settings.RECOVERY_AUDIT_KEYS),
        "SECRET_KEY": settings.SECRET_KEY,  # subject digests are keyed with it
        "DEBUG": "1" if settings.DEBUG else "0",
        "CELERY_BROKER_URL": "",  # nothing of the copy is queued anywhere
    })
    for name in ("RECOVERY_ENCRYPTION_KEYS_FILE", "RECOVERY_AUDIT_KEYS_FILE",
                 "SECRET_KEY_FILE", "DATABASE_URL_FILE"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "django", "restore_drill", "--check"]
    if heads:
        cmd += ["--heads", heads]
    if keyring:
        cmd += ["--keyring", keyring]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              cwd=str(settings.BASE_DIR), timeout=STEP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DrillFailed(f"check: {exc}") from None
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        raise DrillFailed(f"check exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def check(*, heads: str | None, keyring: str | None) -> dict:
    """The checks against the database this process uses (the restored copy): see the
    module docstring. Returns ``{"chain": {"ok": bool, "lines": [...]}, "keyring":
    {...} | None, "tenants": {slug: {"runs": n, "read": k, "erased": e, "other": [status],
    "payloads": {checkpoint id: sha256 of the payload's JSON}}}}``."""
    out: dict = {"chain": {"ok": True, "lines": []}, "keyring": None, "tenants": {}}
    buffer = _Lines()
    try:
        if heads:
            call_command("verify_audit_chain", against=heads, stdout=buffer)
        else:  # a dump given without heads: every chain whole, nothing proves no cut
            call_command("verify_audit_chain", stdout=buffer)
    except CommandError as exc:
        out["chain"]["ok"] = False
        buffer.write(str(exc))
    out["chain"]["lines"] = buffer.lines
    if keyring:
        with open(keyring, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        out["keyring"] = services.keyring_restore(records=records)
    account = services.account_create(username=f"restore-drill-{uuid.uuid4().hex[:8]}",
                                      service=True)
    client = APIClient(SERVER_NAME=_host())
    client.force_authenticate(account)
    secure = bool(getattr(settings, "SECURE_SSL_REDIRECT", False))
    for tenant in Tenant.objects.order_by("slug"):
        services.role_grant(actor=None, tenant=tenant, user=account, role=Role.REVIEWER)
        base = f"/api/v1/tenants/{tenant.slug}/"
        report = {"runs": Run.objects.for_tenant(tenant).count(), "read": 0, "erased": 0,
                  "other": [], "payloads": {}}
        listed = client.get(base + "runs", secure=secure)
        if listed.status_code != 200:
            report["other"].append(f"runs: {listed.status_code}")
        for cid in (Checkpoint.objects.for_tenant(tenant).order_by("-pk")
                    .values_list("uuid", flat=True)[:SAMPLE]):
            got = client.get(f"{base}checkpoints/{cid}", secure=secure)
            if got.status_code == 200:
                report["read"] += 1
                text = json.dumps(got.json()["payload"], sort_keys=True)
                report["payloads"][str(cid)] = hashlib.sha256(text.encode()).hexdigest()
            elif got.status_code == 410 and got.json().get("error") == "erased":
                report["erased"] += 1
            else:
                report["other"].append(f"checkpoint {cid}: {got.status_code}")
        out["tenants"][tenant.slug] = report
    return out


def _host() -> str:
    hosts = [h for h in settings.ALLOWED_HOSTS if h and "*" not in h]
    return hosts[0].lstrip(".") if hosts else "localhost"


class _Lines:
    """A stdout for ``call_command`` that keeps the lines."""

    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += [x for x in text.splitlines() if x.strip()]

    def flush(self) -> None:
        pass


@dataclass
class DrillResult:
    """What ``drill`` found: the check's report and the problems (empty: it passed)."""

    report: dict
    problems: list[str] = field(default_factory=list)


def judge(report: dict, *, erased: set[str]) -> list[str]:
    """The problems in a check's ``report``: a broken chain; a tenant named in ``erased``
    that served a payload, or did not answer erased; any other tenant that did not serve
    each sampled payload."""
    problems = [] if report["chain"]["ok"] else ["audit chain: " + "; ".join(
        report["chain"]["lines"][-3:])]
    for slug in sorted(erased - set(report["tenants"])):
        problems.append(f"{slug}: not in the restored database")
    for slug, t in sorted(report["tenants"].items()):
        if t["other"]:
            problems.append(f"{slug}: " + ", ".join(t["other"]))
        if slug in erased and t["read"]:
            problems.append(f"{slug}: {t['read']} payload(s) still readable")
        if slug not in erased and t["erased"]:
            problems.append(f"{slug}: {t['erased']} payload(s) unreadable")
    return problems


def drill(*, heads: str | None = None, dump_path: str | None = None,
          keyring: str | None = None, erased: set[str] | frozenset = frozenset(),
          target: str | None = None, keep: bool = False) -> DrillResult:
    """The whole drill (module docstring). ``heads``: a file of exported audit heads
    (``export_audit_head --out``, exported **before** the dump; exported now, audited,
    when both it and ``dump_path`` are ``None``; a dump given without heads is verified
    without ``--against``); ``dump_path``: a dump to restore (one is taken now when
    ``None``); ``keyring``: exported since the
    dump (``export_keyring``); ``erased``: tenants that must serve no payload; ``target``:
    the restored copy's name (default ``<database>_drill``), dropped afterwards unless
    ``keep``. Raises ``DrillFailed`` for a step that could not run."""
    pg = _pg()
    target = target or f"{pg['name'][:57]}_drill"
    with tempfile.TemporaryDirectory(prefix="restore-drill-") as tmp:
        if heads is None and dump_path is None:
            # Exported right before the dump, so the dump holds every head exported
            # (heads exported after a dump name events it never had). A dump given
            # without heads is verified without them.
            heads = os.path.join(tmp, "heads.jsonl")
            with open(heads, "w", encoding="utf-8") as fh:
                for tenant in Tenant.objects.order_by("slug"):
                    fh.write(json.dumps(services.audit_head_export(tenant=tenant),
                                        sort_keys=True) + "\n")
        if dump_path is None:
            dump_path = str(dump(os.path.join(tmp, "recovery.dump")))
        restore(dump_path, target)
        try:
            report = check_in_new_process(target, heads=heads, keyring=keyring)
        finally:
            if not keep:
                drop(target)
    return DrillResult(report, judge(report, erased=set(erased)))
