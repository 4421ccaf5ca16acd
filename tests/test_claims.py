"""``tests/claims.py``: the two PostgreSQL processes of ``make test`` run each file once."""

from __future__ import annotations

from types import SimpleNamespace

from tests import claims


def _items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_a_file_split_by_the_database_reordering_is_claimed_run_by_run():
    items = _items("tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/a.py::z",
                   "tests/b.py::C::y")
    assert [(name, [i.nodeid for i in group]) for name, group in claims.runs(items)] == [
        ("tests/a.py#0", ["tests/a.py::x", "tests/a.py::y"]),
        ("tests/b.py#0", ["tests/b.py::x"]),
        ("tests/a.py#1", ["tests/a.py::z"]),
        ("tests/b.py#1", ["tests/b.py::C::y"]),
    ]


def test_a_run_is_won_by_exactly_one_claim(tmp_path):
    assert claims.claim(tmp_path, "tests/a.py#0") is True
    assert claims.claim(tmp_path, "tests/a.py#0") is False
    assert claims.claim(tmp_path, "tests/a.py#1") is True
