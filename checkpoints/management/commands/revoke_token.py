"""``manage.py revoke_token USERNAME``: revoke every token of an account (CONTRACT.md 5).

The API answers 401 to each revoked token from the next request on. Audited in every
tenant where the account holds a role.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from checkpoints import services


class Command(BaseCommand):
    help = "Revoke every bearer token of an account (audited in each tenant it has a role in)."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no account {username!r}")
        prefixes = services.tokens_revoke(user=user)
        if not prefixes:
            self.stdout.write(f"{username} has no live token; nothing revoked")
            return
        self.stdout.write(f"revoked {len(prefixes)} token(s) of {username}: "
                          f"{', '.join(p + '…' for p in prefixes)}")
