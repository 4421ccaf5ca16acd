"""``manage.py deactivate_account USERNAME`` (CONTRACT.md 5).

The account can no longer log in; its sessions and tokens stop working from the next
request on (dashboard: the login page; API: 401); its tokens are revoked. Audited in
every tenant where it holds a role.
"""

from __future__ import annotations

from checkpoints import services
from checkpoints.management.base import AccountCommand, domain_errors, find_account


class Command(AccountCommand):
    help = ("Deactivate an account: no login, no session, every token revoked "
            "(audited in each tenant it has a role in).")

    def handle(self, *args, username: str, **options):
        user = find_account(username)
        with domain_errors():
            done = services.account_deactivate(user=user)
        where = ", ".join(done["tenants"]) or "no tenant (it held no role)"
        self.stdout.write(f"deactivated {username}; tokens revoked: "
                          f"{len(done['tokens_revoked'])}; audited in: {where}")
