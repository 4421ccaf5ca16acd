"""What the account and role commands share: finding the account and the tenant they
name, checking a role, a ``DomainError`` said as a ``CommandError``, and the one body of
``grant`` and ``revoke``.

Every refusal is a ``CommandError`` whose message starts with the argument it is about
(``username: …``, ``tenant: …``, ``role: …``), so the command exits 1 with one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from checkpoints import roles
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant


def find_account(username: str, hint: str = ""):
    """The account named ``username``; ``CommandError`` ("username: no account 'x'",
    then `` hint`` when given) when there is none."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"username: no account {username!r}" + (f" {hint}" if hint else ""))
    return user


def find_tenant(slug: str, hint: str = "") -> Tenant:
    """The tenant whose slug is ``slug``; ``CommandError`` ("tenant: no tenant 'x'", then
    `` hint`` when given) when there is none."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"tenant: no tenant {slug!r}" + (f" {hint}" if hint else ""))
    return tenant


def check_role(role: str) -> str:
    """``role`` when it is one of ``roles.ROLES``; else ``CommandError`` naming them."""
    if role not in roles.ROLE_PERMISSIONS:
        raise CommandError(f"role: unknown role {role!r}; one of {', '.join(roles.ROLES)}")
    return role


@contextmanager
def domain_errors() -> Iterator[None]:
    """A ``DomainError`` raised inside becomes a ``CommandError`` saying its detail (or
    its word when it has none), without the traceback."""
    try:
        yield
    except DomainError as exc:
        raise CommandError(exc.detail or exc.error) from None


class AccountCommand(BaseCommand):
    """A command whose one argument is an account's ``username``."""

    def add_arguments(self, parser):
        parser.add_argument("username")


class RoleCommand(BaseCommand):
    """``grant`` and ``revoke``: ``USERNAME ROLE TENANT``. The role is checked first,
    then the account, then the tenant (each a ``CommandError`` naming it, with
    ``missing_hint`` after the missing account or tenant); then ``change``, its
    ``DomainError`` said as a ``CommandError``; then ``done`` is printed, formatted with
    ``role``, ``tenant`` (the slug) and ``user`` (the username)."""

    #: What follows "no account 'x'"/"no tenant 'x'": a hint at the command to run first.
    missing_hint: tuple[str, str] = ("", "")
    #: The line printed on success.
    done: str

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", help=", ".join(roles.ROLES))
        parser.add_argument("tenant", help="tenant slug")

    def handle(self, *args, username: str, role: str, tenant: str, **options):
        check_role(role)
        account_hint, tenant_hint = self.missing_hint
        user = find_account(username, account_hint)
        tenant_obj = find_tenant(tenant, tenant_hint)
        with domain_errors():
            self.change(tenant=tenant_obj, user=user, role=role)
        self.stdout.write(self.done.format(role=role, tenant=tenant_obj.slug,
                                           user=user.get_username()))

    def change(self, *, tenant: Tenant, user, role: str) -> None:
        """The service call (``services.role_grant`` or ``role_revoke``, by the command
        itself, ``actor=None``); raises what the service raises."""
        raise NotImplementedError
