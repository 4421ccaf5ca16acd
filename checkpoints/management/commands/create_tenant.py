"""``manage.py create_tenant SLUG [--name NAME]`` (CONTRACT.md section 5)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug

from checkpoints import services
from checkpoints.exceptions import DomainError


class Command(BaseCommand):
    help = "Create a tenant (an organisation) and start its audit chain."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="URL name of the tenant: letters, digits, - and _")
        parser.add_argument("--name", default="", help="display name (default: the slug)")

    def handle(self, *args, slug: str, name: str, **options):
        try:
            validate_slug(slug)
        except ValidationError:
            raise CommandError(
                f"slug: {slug!r} is not a valid slug (letters, digits, hyphens, underscores)"
            ) from None
        if len(slug) > 64:
            raise CommandError("slug: at most 64 characters")
        if len(name) > 200:
            raise CommandError("--name: at most 200 characters")
        try:
            tenant = services.tenant_create(slug=slug, name=name)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        self.stdout.write(f"created tenant {tenant.slug} ({tenant.name})")
