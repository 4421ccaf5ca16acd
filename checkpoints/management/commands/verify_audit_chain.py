"""``manage.py verify_audit_chain [TENANT] [--against FILE]``: check each tenant's audit
chain (docs/security/audit.md).

Every tenant ever created must still be there: the tenant registry (``AuditTenant``,
keyed rows numbered without gaps) names each, so a tenant whose row, events and head were
all deleted is reported by its slug, as is a tenant missing from the registry.
Each tenant checked (one, or all) has its queued events integrated first (the sequencer,
``audit_integrate``), then must have an intact trail (``audittree.audit_verify``): every
event matching its HMAC, the chained events of before issue 22 linked seq 1..n up to the
chain head, and the Merkle tree's leaves, stored nodes and signed heads (Ed25519) agreeing
with the events, every event in the tree or still queued. With ``--against``, each head
exported earlier by ``export_audit_head`` (JSON lines; for one tenant, only its lines)
must carry a valid signature, and a consistency proof from it to the newest head must
verify (RFC 9162); a line exported before the tree must still be in the chain with the
same hash. This is what shows that events were cut from the end.

Each tenant checked also gets a line saying how many of its events refer to erased data
(runs whose payloads retention or erasure deleted: their ``Tombstone``): the chain
verifies all the same, since it holds hashes of what was deleted, never the content
(issue 20, item 3). With ``--export DIR`` (repeatable), an export written by
``export_audit`` is checked with the keys alone (manifest signature, the signed tree
head it carries, file hashes, every event's HMAC and link, the Merkle root of its leaves
equal to the head's) and against the database (the tree still extends the exported head,
a consistency proof; the chain still holds its highest event).

Run without a tenant, it records two heartbeats (``checkpoints.heartbeat``, database clock)
when it finishes: ``audit.verify`` always, then ``audit.intact`` when everything held.
``/metrics`` serves them (``recovery_heartbeat_timestamp_seconds``) and the shipped
alerting rules fire when the last run found a break or no run finished for a day
(deploy/prometheus/recovery-rules.yml, docs/operations/alerts.md). A run for one tenant
records nothing: it does not speak for the others.

Prints one line per tenant and per exported head; exits 0 when all hold, else 1
(``CommandError``) naming each broken tenant and its first problem. A tenant that does
not exist, or an unreadable or malformed FILE (line and field named), also exits 1.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import auditexport, heartbeat, services
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant
from checkpoints.ops.operatorfiles import open_input


def _read_exports(path: str, tenant: str | None) -> list[tuple[int, dict]]:
    # A regular file (or -), bounded like an import (checkpoints.ops.operatorfiles, issue 17).
    stream, _ = open_input(path, what="--against")
    try:
        with stream:
            lines = stream.read().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--against: cannot read {path!r} ({exc})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = services.audit_head_parse(line)
        except DomainError as exc:
            raise CommandError(f"--against: {path} line {number}: {exc.detail}") from None
        if tenant is None or record["tenant"] == tenant:
            records.append((number, record))
    if not any(line.strip() for line in lines):
        # A truncated heads file must not pass as "every head holds" (an attack's finding).
        raise CommandError(f"--against: {path} holds no exported head")
    return records


class Command(BaseCommand):
    help = ("Verify each tenant's keyed audit chain and head (and, with --against, heads "
            "exported earlier); exits non-zero naming the tenant and its first problem.")

    def add_arguments(self, parser):
        parser.add_argument("tenant", nargs="?", help="tenant slug (default: every tenant)")
        parser.add_argument("--against", metavar="FILE",
                            help="JSON lines written by export_audit_head: each exported head "
                                 "must still be in its chain")
        parser.add_argument("--export", metavar="DIR", action="append", default=[],
                            help="a directory written by export_audit: its manifest and "
                                 "files must verify and its last event be in the chain")

    def handle(self, *args, tenant: str | None, against: str | None, export: list[str],
               **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant is not None:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"tenant: no tenant {tenant!r}")
        exports = _read_exports(against, tenant) if against else []
        broken: dict[str, str] = {}
        # Every tenant ever created, from the registry: one deleted with its events and
        # head is named too (issue 17, item 13).
        for slug, problem in services.registry_verify(slug=tenant):
            self.stdout.write(f"{slug}: BROKEN at {problem}")
            broken.setdefault(slug, problem)
        for t in tenants:
            # Everything committed first (issue 22): the sequencer integrates the queue.
            while services.audit_integrate(t):
                pass
            intact, n, problem = services.audit_verify(tenant=t)
            if intact:
                self.stdout.write(f"{t.slug}: intact ({n} event(s))")
            else:
                self.stdout.write(f"{t.slug}: BROKEN at {problem}")
                broken.setdefault(t.slug, problem)
            erased = auditexport.erased_event_count(t)
            self.stdout.write(f"{t.slug}: {erased} event(s) refer to erased data")
        for directory in export:
            self._check_export(directory, tenant, broken)
        for number, record in exports:
            problem = services.audit_head_check(record=record)
            slug = record["tenant"]
            if problem:
                self.stdout.write(f"{slug}: BROKEN against {against} line {number}: {problem}")
                broken.setdefault(slug, problem)
            elif "tree_size" in record:
                self.stdout.write(f"{slug}: holds exported head size {record['tree_size']} "
                                  f"of {record['created_at']} (consistency proof verified)")
            else:
                self.stdout.write(f"{slug}: holds exported head seq {record['seq']} "
                                  f"of {record['exported_at']}")
        if tenant is None:  # the round first, then its success: intact is never older
            heartbeat.beat(heartbeat.AUDIT_VERIFY, *(() if broken else (heartbeat.AUDIT_INTACT,)))
        if broken:
            raise CommandError("audit chain broken for: " + "; ".join(
                f"{slug}: {problem}" for slug, problem in sorted(broken.items())))

    def _check_export(self, directory: str, tenant: str | None, broken: dict) -> None:
        manifest, problems = auditexport.verify_export(directory)
        if manifest is None:
            slug = tenant or directory
        else:
            # A manifest that does not verify names no tenant it can be trusted for: it
            # is reported under the tenant asked about (an attack's finding: an edited
            # "tenant" made the check skip the export and succeed).
            slug = manifest["tenant"] if not problems else (tenant or manifest["tenant"])
            if tenant is not None and slug != tenant:
                return
            if not problems:
                problem = auditexport.export_db_problem(manifest)
                problems = [problem] if problem else []
        if problems:
            self.stdout.write(f"{slug}: BROKEN export {directory}: {problems[0]}")
            broken.setdefault(slug, f"export {directory}: {problems[0]}")
        else:
            size = manifest.get("through_tree_size")
            held = (f"tree size {size} under its signed head, seq up to "
                    if size is not None else "through seq ")
            self.stdout.write(
                f"{slug}: export {directory} verifies ({manifest['counts']['events']} "
                f"event(s), {held}{manifest['through_seq']}, "
                f"{manifest['counts']['tombstones']} tombstone(s))")
