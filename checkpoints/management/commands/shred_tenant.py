"""``manage.py shred_tenant SLUG --confirm SLUG``: crypto-shred a tenant (issue 20, item 3;
docs/security/encryption.md).

Destroys the tenant's data keys (``services.tenant_shred``, audited ``tenant.key_destroy``
in the tenant's chain): every payload, receipt, request, refused write, evidence and
LangGraph blob it stored becomes unreadable; its rows, metadata and audit stay. There is
no undo and no API: it is the operator's act. Backups taken before still hold the data
keys, wrapped by the master key of that time: rotate the master key afterwards
(docs/security/encryption.md, "Crypto-shredding and backups") and keep the printed key
ids with the exported audit heads.

Exits 1 (``CommandError``) for an unknown tenant, a ``--confirm`` that does not repeat
the slug, or an active legal hold.
"""

from __future__ import annotations

import json

from cryptography.fernet import InvalidToken
from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant


class Command(BaseCommand):
    help = "Destroy a tenant's data keys: everything it stored becomes unreadable (audited)."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--confirm", required=True, metavar="SLUG",
                            help="the tenant's slug again: there is no undo")

    def handle(self, *args, tenant: str, confirm: str, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        try:
            done = services.tenant_shred(actor=None, tenant=found, confirm_slug=confirm)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        except InvalidToken:
            raise CommandError("a legacy ciphertext of the tenant fits none of "
                               "RECOVERY_ENCRYPTION_KEYS") from None
        self.stdout.write(json.dumps(done, sort_keys=True))
