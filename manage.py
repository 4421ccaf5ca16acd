#!/usr/bin/env python
"""Django's command-line utility for the recovery service."""

import os
import sys


def refuse_bad_arguments(argv: list[str]) -> str:
    """Why the command line cannot be used ("" if it can).

    Python decodes bytes that are not UTF-8 in ``argv`` to unpaired surrogates, which no
    column can store (PostgreSQL refuses them); every command's arguments (slugs, user
    names, service names, URLs) are refused here, in one place, before Django starts
    (CONTRACT.md section 6 rules applied to the command line; issue 6, fault 4).
    """
    for position, arg in enumerate(argv[1:], start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "backslashreplace").decode("utf-8")[:60]
            return f"argument {position} ({shown}): not valid UTF-8 text"
    return ""


def main() -> None:
    problem = refuse_bad_arguments(sys.argv)
    if problem:
        sys.stderr.write(f"manage.py: {problem}\n")
        sys.exit(2)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
