"""``manage.py issue_token USERNAME``: print a new bearer token once (CONTRACT.md 5).

Only the token's SHA-256 is stored, so the printed line is the only copy. Audited as
``token.issue`` (the prefix, never the token) in every tenant where the account holds a
role, like ``revoke_token``; the tenants are named on stderr.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError


class Command(BaseCommand):
    help = "Issue a bearer token for an account; prints it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no account {username!r} (create_account first)")
        if not user.is_active:
            raise CommandError(f"username: account {username!r} is inactive")
        try:
            raw = services.token_issue(user=user)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        # The token alone on stdout, so scripts can capture it: TOKEN=$(manage.py issue_token x)
        self.stdout.write(raw)
        tenants = [t.slug for t, _ in services.account_tenants(user)]
        self.stderr.write(f"issued token {raw[:12]}… to {username}; audited in: "
                          + (", ".join(tenants) or "no tenant (it holds no role)"))
