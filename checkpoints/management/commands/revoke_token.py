"""``manage.py revoke_token USERNAME``: revoke every token of an account (CONTRACT.md 5).

The API answers 401 to each revoked token from the next request on. Audited in every
tenant where the account holds a role.
"""

from __future__ import annotations

from checkpoints import services
from checkpoints.management.base import AccountCommand, find_account


class Command(AccountCommand):
    help = "Revoke every bearer token of an account (audited in each tenant it has a role in)."

    def handle(self, *args, username: str, **options):
        user = find_account(username)
        prefixes = services.tokens_revoke(user=user)
        if not prefixes:
            self.stdout.write(f"{username} has no live token; nothing revoked")
            return
        self.stdout.write(f"revoked {len(prefixes)} token(s) of {username}: "
                          f"{', '.join(p + '…' for p in prefixes)}")
