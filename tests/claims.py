"""Two pytest processes sharing one PostgreSQL pass, file by file (``make test``).

``make test`` runs two lanes side by side on CI's two cores: the PostgreSQL pass, and the
SQLite pass followed by a second PostgreSQL process. The two PostgreSQL processes collect
the same tests and run each test file once between them: before a file's tests run, the
process claims the file in ``RECOVERY_TEST_CLAIMS`` (a directory; one empty file a claim,
made with ``O_CREAT | O_EXCL``, so exactly one process wins it) and skips the files the
other process already claimed. The first process walks the files in order, the second
(``RECOVERY_TEST_CLAIM_ORDER=reverse``) from the end, so they meet wherever the lanes'
times make them meet: no table of durations to keep up to date, and a lane that ends
early (the SQLite pass) takes over part of the longer one.

A file's tests may come in up to three runs (pytest-django runs the database tests, then
the transactional ones, then those without a database); each run is claimed on its own.
Without ``RECOVERY_TEST_CLAIMS`` pytest's own loop runs every test (``make
test-postgres``, a narrowed run, a developer's ``pytest``).
"""

from __future__ import annotations

import hashlib
import os
from itertools import groupby
from pathlib import Path

#: The directory the two processes claim in (``make``: a new subfolder of ``CLAIMS`` per
#: invocation, so it is empty when the run starts).
CLAIMS_ENV = "RECOVERY_TEST_CLAIMS"
#: ``reverse``: walk the files from the last one.
ORDER_ENV = "RECOVERY_TEST_CLAIM_ORDER"


def runs(items: list) -> list[tuple[str, list]]:
    """``items`` cut into runs of consecutive tests of one file, each named
    ``"<nodeid path>#<k>"``, ``k`` counting that file's runs from 0 (the same names in
    both processes, which collect the same tests in the same order)."""
    seen: dict[str, int] = {}
    out = []
    for path, group in groupby(items, key=lambda item: item.nodeid.split("::", 1)[0]):
        k = seen.get(path, 0)
        seen[path] = k + 1
        out.append((f"{path}#{k}", list(group)))
    return out


def claim(directory: Path, name: str) -> bool:
    """Whether this process wins ``name`` (``True`` once across all processes using
    ``directory``)."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    try:
        fd = os.open(directory / digest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(name + "\n")
    return True


def runtestloop(session) -> bool | None:
    """pytest's ``runtestloop`` over the runs this process claims (``runs``); ``None``
    (pytest's own loop) without ``RECOVERY_TEST_CLAIMS``. Each test's ``nextitem`` is
    the next test this process will run, so module fixtures are torn down as usual."""
    directory = os.environ.get(CLAIMS_ENV)
    if not directory or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        return None  # pytest's own loop reports the collection errors
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    order = runs(session.items)
    if os.environ.get(ORDER_ENV) == "reverse":
        order.reverse()

    def claimed():
        for name, items in order:
            if claim(directory, name):
                yield from items

    todo = claimed()
    item = next(todo, None)
    while item is not None:
        nextitem = next(todo, None)  # at a run's last test: claims the next run first
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    return True
