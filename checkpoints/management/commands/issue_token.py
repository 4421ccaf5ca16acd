"""``manage.py issue_token USERNAME``: print a new bearer token once (CONTRACT.md 5).

Only the token's SHA-256 is stored, so the printed line is the only copy. Audited as
``token.issue`` (the prefix, never the token) in every tenant where the account holds a
role, like ``revoke_token``; the tenants are named on stderr.
"""

from __future__ import annotations

from django.core.management.base import CommandError

from checkpoints import services
from checkpoints.management.base import AccountCommand, domain_errors, find_account


class Command(AccountCommand):
    help = "Issue a bearer token for an account; prints it once (only its hash is stored)."

    def handle(self, *args, username: str, **options):
        user = find_account(username, "(create_account first)")
        if not user.is_active:
            raise CommandError(f"username: account {username!r} is inactive")
        with domain_errors():
            raw = services.token_issue(user=user)
        # The token alone on stdout, so scripts can capture it: TOKEN=$(manage.py issue_token x)
        self.stdout.write(raw)
        tenants = [t.slug for t, _ in services.account_tenants(user)]
        self.stderr.write(f"issued token {raw[:12]}… to {username}; audited in: "
                          + (", ".join(tenants) or "no tenant (it holds no role)"))
