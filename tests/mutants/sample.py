"""Names of a seeded random sample of a module's mutmut mutants, for ``make mutants``.

Usage: ``python -m tests.mutants.sample --seed 7 checkpoints/services/effects.py:30 ...`` prints
the chosen mutant names, one a line (``FILE:N``: N of that file's mutants; ``FILE:all``:
every one as a glob). The names are the ones ``mutmut run`` generates (the same libcst
mutation of the same source), so the sample is reproducible: the same seed and source
give the same mutants.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name


def names(path: str) -> list[str]:
    source = Path(path).read_text("utf-8")
    mutated = mutate_file_contents(path, source, None, None)
    return sorted(get_mutant_name(Path(path), n) for n in mutated.mutant_names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("specs", nargs="+", metavar="FILE:N|FILE:all")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    for spec in args.specs:
        path, _, n = spec.partition(":")
        if n in ("", "all"):
            print(path.removesuffix(".py").replace("/", ".") + ".*")
            continue
        every = names(path)
        for name in sorted(rng.sample(every, min(int(n), len(every)))):
            print(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
