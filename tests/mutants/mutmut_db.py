"""pytest plugin for ``make mutants``: every pytest session gets its own SQLite test
database, copied from one migrated template, instead of migrating its own.

mutmut runs pytest in-process and forks one child per mutant (two at a time). Without
this, the children would share the settings' one test database file and each would spend
seconds migrating it. ``$RECOVERY_MUTMUT_DB_TEMPLATE`` names the template
(``python -m tests.mutants.template_db PATH`` makes it); without the variable the plugin
does nothing. Loaded only by mutmut (``[tool.mutmut] pytest_add_cli_args``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

_copy: Path | None = None


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    global _copy
    template = os.environ.get("RECOVERY_MUTMUT_DB_TEMPLATE")
    if not template:
        return
    from django.conf import settings

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("sqlite3"):
        raise pytest.UsageError("make mutants runs on SQLite: unset DATABASE_URL")
    _copy = Path(template).with_name(f"session-{os.getpid()}.sqlite3")
    shutil.copyfile(template, _copy)
    db.setdefault("TEST", {})["NAME"] = str(_copy)
    # Keep (reuse) the copy: it is already migrated; pytest-django then only checks it.
    config.option.reuse_db = True
    config.option.create_db = False


def pytest_unconfigure(config):
    global _copy
    if _copy is not None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{_copy}{suffix}").unlink(missing_ok=True)
        _copy = None
