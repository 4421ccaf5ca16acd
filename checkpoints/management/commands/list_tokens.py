"""``manage.py list_tokens USERNAME``: an account's bearer tokens, newest first.

One line per token: its prefix (the first 12 characters; the rest is never stored),
when it was created, when it was last used (to the minute: see
``services.TOKEN_TOUCH_INTERVAL``) and when it was revoked. Reads only.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from checkpoints import selectors


def _when(value) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else "-"


class Command(BaseCommand):
    help = "List an account's bearer tokens: prefix, created, last used, revoked."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no account {username!r}")
        tokens = selectors.tokens_of_account(user=user)
        if not tokens:
            self.stdout.write(f"{username} has no token")
            return
        self.stdout.write(f"{'prefix':<14}{'created':<22}{'last used':<22}revoked")
        for t in tokens:
            self.stdout.write(f"{t.prefix + '…':<14}{_when(t.created_at):<22}"
                              f"{_when(t.last_used_at):<22}{_when(t.revoked_at)}")
