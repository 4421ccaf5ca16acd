"""``manage.py list_tokens USERNAME``: an account's bearer tokens, newest first.

One line per token: its prefix (the first 12 characters; the rest is never stored),
when it was created, when it was last used (to the minute: see
``services.TOKEN_TOUCH_INTERVAL``) and when it was revoked. Reads only.
"""

from __future__ import annotations

from checkpoints import selectors
from checkpoints.management.base import AccountCommand, find_account


def _when(value) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else "-"


class Command(AccountCommand):
    help = "List an account's bearer tokens: prefix, created, last used, revoked."

    def handle(self, *args, username: str, **options):
        user = find_account(username)
        tokens = selectors.tokens_of_account(user=user)
        if not tokens:
            self.stdout.write(f"{username} has no token")
            return
        self.stdout.write(f"{'prefix':<14}{'created':<22}{'last used':<22}revoked")
        for t in tokens:
            self.stdout.write(f"{t.prefix + '…':<14}{_when(t.created_at):<22}"
                              f"{_when(t.last_used_at):<22}{_when(t.revoked_at)}")
