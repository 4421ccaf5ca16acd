"""``manage.py deactivate_account USERNAME`` (CONTRACT.md 5).

The account can no longer log in; its sessions and tokens stop working from the next
request on (dashboard: the login page; API: 401); its tokens are revoked. Audited in
every tenant where it holds a role.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError


class Command(BaseCommand):
    help = ("Deactivate an account: no login, no session, every token revoked "
            "(audited in each tenant it has a role in).")

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no account {username!r}")
        try:
            done = services.account_deactivate(user=user)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        where = ", ".join(done["tenants"]) or "no tenant (it held no role)"
        self.stdout.write(f"deactivated {username}; tokens revoked: "
                          f"{len(done['tokens_revoked'])}; audited in: {where}")
