"""``manage.py`` with one test-only hook: the process stops, holding what it holds, at
the ``--hold-at``-th checkpoint a migration writes, says so on stdout, and waits for
its stdin to close (the test SIGKILLs it there instead). Used by
``test_migration_death.py``; never imported by the product.

    python -m tests.crash.held_migration --hold-at N --hold {before_commit,after_commit} \\
        -- migrate_checkpoints acme.order --to 2 --batch-size K

``before_commit``: the N-th checkpoint's new revision, history row and audit event are
written and its transaction is still open (the kill must roll all of it back);
``after_commit``: the N-th checkpoint's transaction has committed and the next one has
not started. The line printed is ``HELD <n> <checkpoint id>``.
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

    from checkpoints.services import migrations

    done = []

    def hold(checkpoint_id) -> None:
        print(f"{HELD} {len(done)} {checkpoint_id}", flush=True)
        sys.stdin.read()  # until the test kills this process (or closes stdin)
        raise SystemExit("held migration released without a kill")

    write, migrate_one = migrations.writepath.checkpoint_write, migrations._migrate_one

    def held_write(**kw):
        written = write(**kw)
        done.append(kw["envelope"].checkpoint_id)
        if args.hold == "before_commit" and len(done) == args.hold_at:
            hold(done[-1])
        return written

    def held_migrate_one(*a, **kw):
        result = migrate_one(*a, **kw)
        if args.hold == "after_commit" and len(done) == args.hold_at:
            hold(done[-1])
        return result

    migrations.writepath.checkpoint_write = held_write
    migrations._migrate_one = held_migrate_one
    execute_from_command_line(["manage.py", *command])


if __name__ == "__main__":
    main(sys.argv[1:])
