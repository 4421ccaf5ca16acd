"""Is the static files manifest there, and does it name what the pages need? (issue 17,
item 5). With ``DEBUG=0`` (``RECOVERY_STATIC_MANIFEST``) every page's ``{% static %}``
looks its file up in the manifest ``collectstatic`` writes; without it (``collectstatic``
skipped) or with a stale one (an entry a template needs is missing), every HTML page
fails. So this is a deploy check (``manage.py check --deploy``: ``recovery.E002``), a
readiness check (``/readyz``: ``static_manifest``) and what the 500 page says.

What the pages need: every literal ``{% static '...' %}`` in the project's templates
(``TEMPLATES[0]["DIRS"]`` and ``checkpoints/templates``).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.storage import ManifestFilesMixin
from django.core import checks
from django.core.files.storage import storages

_STATIC_TAG = re.compile(r"""{%\s*static\s+['"]([^'"]+)['"]""")


@cache
def needed_static_paths() -> frozenset[str]:
    """The static paths the project's templates name literally, e.g. ``css/app.css``."""
    roots = [Path(d) for config in settings.TEMPLATES for d in config.get("DIRS", [])]
    roots.append(Path(__file__).resolve().parent / "templates")
    found: set[str] = set()
    for root in roots:
        for template in root.rglob("*.html") if root.is_dir() else ():
            found.update(_STATIC_TAG.findall(template.read_text(encoding="utf-8")))
    return frozenset(found)


def manifest_problem() -> str | None:
    """What is wrong with the static manifest this process serves from, or ``None``
    (also when no manifest is used: ``DEBUG`` on, or the test runner)."""
    target = storages["staticfiles"]  # the instance {% static %} uses
    if not isinstance(target, ManifestFilesMixin):
        return None
    if not target.hashed_files:
        return (f"the static files manifest ({target.manifest_name} in "
                f"{settings.STATIC_ROOT}) is missing or empty: run "
                "`manage.py collectstatic --noinput` (then restart the web processes)")
    missing = sorted(path for path in needed_static_paths() if path not in target.hashed_files)
    if missing:
        return (f"the static files manifest is stale: no entry for {', '.join(missing)}: run "
                "`manage.py collectstatic --noinput` again (then restart the web processes)")
    return None


class StaticManifestError(Exception):
    """The static manifest is missing or stale (``/readyz``'s ``static_manifest``)."""


def check_static_manifest() -> None:
    """The readiness probe: raises ``StaticManifestError`` naming the problem."""
    problem = manifest_problem()
    if problem:
        raise StaticManifestError(problem)


@checks.register(checks.Tags.staticfiles, deploy=True)
def static_manifest_check(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``recovery.E002``: the manifest is missing or lacks an entry a template needs."""
    problem = manifest_problem()
    if problem is None:
        return []
    return [checks.Error(f"Static files: {problem}.",
                         hint="Every HTML page answers 500 until the manifest is complete "
                              "(README \"Production\").", id="recovery.E002")]
