"""Make the migrated SQLite test database that ``mutmut_db`` copies for each session.

Usage: ``python -m tests.mutants.template_db PATH`` (SQLite only: DATABASE_URL is
ignored). Builds the database exactly as pytest-django's test database is built
(``create_test_db``: every migration, then the post-migrate signals) and closes it, so
the file is complete (no write-ahead log left beside it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(path: str) -> None:
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
    import django

    django.setup()
    from django.db import connection

    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    connection.settings_dict.setdefault("TEST", {})["NAME"] = str(target)
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False,
                                       keepdb=False)
    connection.close()
    print(f"migrated template test database: {target}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.mutants.template_db PATH")
    main(sys.argv[1])
