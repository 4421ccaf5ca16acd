"""``manage.py`` with one test-only hook: the process stops, holding what it holds, at
the ``--hold-at``-th run a retention purge deletes, says so on stdout, and waits for its
stdin to close (the test SIGKILLs it there instead). Used by ``test_purge_death.py``;
never imported by the product.

    python -m tests.crash.held_purge --hold-at N --hold {before_commit,after_commit} \\
        -- purge_expired --batch-size K

``before_commit``: the N-th run's deletion, tombstone and audit event are written and its
transaction is still open (the kill must roll all of it back); ``after_commit``: the N-th
run's transaction has committed and the next one has not started. The line printed is
``HELD <n> <run id>``.
"""

from __future__ import annotations

import argparse
import os
import sys

HELD = "HELD"


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hold-at", type=int, required=True)
    p.add_argument("--hold", choices=("before_commit", "after_commit"), required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from checkpoints.services import retention

    done = []

    def hold(run_id) -> None:
        print(f"{HELD} {len(done)} {run_id}", flush=True)
        sys.stdin.read()  # until the test kills this process (or closes stdin)
        raise SystemExit("held purge released without a kill")

    purge, purge_one = retention.purge_run_payloads, retention._purge_one

    def held_purge(**kw):
        purged = purge(**kw)
        done.append(kw["run"].uuid)
        if args.hold == "before_commit" and len(done) == args.hold_at:
            hold(done[-1])
        return purged

    def held_purge_one(*a, **kw):
        outcome = purge_one(*a, **kw)
        if args.hold == "after_commit" and len(done) == args.hold_at:
            hold(done[-1])
        return outcome

    retention.purge_run_payloads = held_purge
    retention._purge_one = held_purge_one
    execute_from_command_line(["manage.py", *command])


if __name__ == "__main__":
    main(sys.argv[1:])
