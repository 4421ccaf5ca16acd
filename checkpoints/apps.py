import importlib

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from . import kinds


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints and recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, once the app registry is ready (Django's rule for ready()):
        # importing them registers their system checks.
        from .ops import (
            security,  # noqa: F401 (registers its deploy checks)
            staticcheck,  # noqa: F401 (registers recovery.E002)
        )

        load_kind_modules(settings.RECOVERY_KIND_MODULES)
        set_offline_kinds(settings.RECOVERY_OFFLINE_KINDS)


def load_kind_modules(names: list[str]) -> None:
    """Import the user's kind modules (``RECOVERY_KIND_MODULES``: dotted names), in order,
    once: each registers its kinds with ``checkpoints.kinds.register`` when imported
    (docs/kinds.md).

    The first that cannot be imported, or whose import raises (a refused ``register``
    included: a built-in kind, a bad name or version), raises ``ImproperlyConfigured``
    naming the module and the cause, which stops every process at start-up: web, worker,
    ``manage.py check`` and every other command. Not a system check: gunicorn and Celery
    run none, and a process serving without a configured kind would classify that kind's
    checkpoints ``unsupported`` (their runs ``schema_mismatch``) until a restart."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - whatever it is, start-up stops, named
            raise ImproperlyConfigured(
                f"RECOVERY_KIND_MODULES: kind module {name!r} could not be loaded: "
                f"{type(exc).__name__}: {exc}") from exc


def set_offline_kinds(names: list[str]) -> None:
    """Make each kind of ``RECOVERY_OFFLINE_KINDS`` (kind names) migrate offline
    (``kinds.set_migration_mode(kind, "offline")``; docs/migrations.md): a resume of a run
    whose latest checkpoint is an older version answers ``reject`` /
    ``migration_required`` until the run is migrated. Called once at start-up, after the
    kind modules are loaded (``load_kind_modules``), so a kind of theirs may be named.

    A name that is not a kind registered in code (built in or from a kind module; a
    tenant's declared kinds have no offline mode) raises ``ImproperlyConfigured`` naming
    it and the registered kinds, before any kind is changed: every process stops at
    start-up, like a bad kind module (gunicorn and Celery run no system checks, and a
    process resuming what the others refuse would undo the operator's choice)."""
    unknown = [name for name in names if not kinds.in_code(name)]
    if unknown:
        raise ImproperlyConfigured(
            f"RECOVERY_OFFLINE_KINDS: kind {unknown[0]!r} is not registered (built in or "
            f"from RECOVERY_KIND_MODULES); registered: {', '.join(kinds.registered())}")
    for name in names:
        kinds.set_migration_mode(name, "offline")
