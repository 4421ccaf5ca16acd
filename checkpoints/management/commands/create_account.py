"""``manage.py create_account USERNAME [--password-stdin] [--service]`` (CONTRACT.md 5).

A login account needs a password, read from standard input (first line) with
``--password-stdin``; without it, or with ``--service``, the account cannot log in to the
dashboard and uses bearer tokens (``issue_token``).
"""

from __future__ import annotations

import sys

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError


class Command(BaseCommand):
    help = "Create an account (a person with a password, or a service account for tokens)."
    stealth_options = ("stdin",)  # call_command(..., stdin=io.StringIO("pw\n")) in tests

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password-stdin", action="store_true",
                            help="read the password from the first line of standard input")
        parser.add_argument("--service", action="store_true",
                            help="a service account: no password, bearer tokens only")

    def handle(self, *args, username: str, password_stdin: bool, service: bool, **options):
        if service and password_stdin:
            raise CommandError("--service accounts have no password; drop --password-stdin")
        field = get_user_model()._meta.get_field("username")
        try:
            field.run_validators(username)
        except ValidationError as exc:
            raise CommandError(f"username: {' '.join(exc.messages)}") from None
        if not username or len(username) > field.max_length:
            raise CommandError(f"username: 1..{field.max_length} characters")
        password = None
        if password_stdin:
            password = (options.get("stdin") or sys.stdin).readline()
            password = password.rstrip("\r\n")
            if not password:
                raise CommandError("password: standard input gave an empty password")
        try:
            user = services.account_create(username=username, password=password, service=service)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        what = "service account" if service else (
            "account" if password else "account without password (tokens only)")
        self.stdout.write(f"created {what} {user.get_username()}")
