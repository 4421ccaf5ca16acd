"""``manage.py register_kind TENANT KIND VERSION FILE``: declare a kind version for a
tenant from a JSON file (``-``: standard input), as its admin would with ``PUT
…/kinds/{kind}/versions/{v}`` (issue 19, item 1; docs/kinds.md "Declaring a kind without
Python").

The declaration is checked, stored and audited by ``services.kind_declare`` (actor: the
operator). stdout: one line saying whether the version was created, replaced (no
checkpoint used it) or unchanged. Exit status 1, with the field named, for a bad tenant,
file, kind, version or declaration, and for a version a checkpoint already uses; nothing
is written then.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from checkpoints import intranges, services
from checkpoints.exceptions import DomainError
from checkpoints.jsonparse import loads_object
from checkpoints.kinds.declarative import MAX_DECLARATION_BYTES
from checkpoints.models import Tenant


class Command(BaseCommand):
    help = "Declare a kind version (JSON Schema + phase map) for a tenant (docs/kinds.md)."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("kind", help="the kind, e.g. acme.refund")
        parser.add_argument("version", help="the schema version it declares (0..2^32-1)")
        parser.add_argument("file", help="the declaration, a JSON file; - for standard input")

    def handle(self, *args, tenant: str, kind: str, version: str, file: str, **options):
        try:  # the API's reading of {v}, not int()'s
            number = intranges.SCHEMA_VERSION.parse(version, "version")
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        try:
            if file == "-":
                raw = sys.stdin.buffer.read(MAX_DECLARATION_BYTES * 4 + 1)
            else:
                with open(file, "rb") as handle:
                    raw = handle.read(MAX_DECLARATION_BYTES * 4 + 1)
        except OSError as exc:
            raise CommandError(f"file: cannot read {file!r} ({exc.strerror})") from None
        try:
            if len(raw) > MAX_DECLARATION_BYTES * 4:
                raise CommandError(f"file: larger than {MAX_DECLARATION_BYTES * 4} bytes")
            body = loads_object(raw)
            row, outcome = services.kind_declare(actor=None, tenant=found, kind=kind,
                                                 version=number, body=body)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        self.stdout.write(f"{found.slug}: {row.kind} v{row.version} {outcome} "
                          f"(digest {row.digest[:12]})")
