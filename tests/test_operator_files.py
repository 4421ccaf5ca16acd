"""Operator commands on hostile files (issue 17, item 9; ``checkpoints.ops.operatorfiles``).

``import_runifold`` and ``verify_audit_chain --against`` take a path from the operator. A
FIFO, ``/dev/zero`` behind a symlink, a directory, a file over ``RECOVERY_IMPORT_MAX_BYTES``
or over ``RECOVERY_IMPORT_MAX_LINES`` (from a file or from standard input) is refused
quickly with a ``CommandError`` naming the argument and the rule, and nothing is written
(the whole database is compared). Each command runs with a deadline (SIGALRM), so a
command that blocks or reads forever fails the test instead of hanging it.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import stat
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.matrixhelpers import db_diff, db_state

FIXTURES = Path(__file__).parent / "fixtures" / "runifold"
AGENT = FIXTURES / "agent.v1.jsonl"  # 3 valid lines
DEADLINE_S = 10


class _Deadline(Exception):
    pass


def _within_deadline(fn):
    """Run ``fn()`` (in this thread: it uses the test's database connection); a failure
    when it is still running after ``DEADLINE_S`` (SIGALRM interrupts a blocking open of
    a FIFO as well as an endless read)."""

    def expire(signum, frame):
        raise _Deadline

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
    try:
        return fn()
    except _Deadline:
        pytest.fail(f"the command was still running after {DEADLINE_S} s (it blocks or "
                    f"reads forever)")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _import(path: str) -> None:
    call_command("import_runifold", path, tenant="acme", no_progress=True,
                 stdout=io.StringIO(), stderr=io.StringIO())


def _verify(path: str) -> None:
    call_command("verify_audit_chain", against=path, stdout=io.StringIO())


COMMANDS = {"import_runifold": (_import, "file"), "verify_audit_chain": (_verify, "--against")}


def _hostile(kind: str, tmp_path: Path) -> tuple[str, str]:
    """A path of ``kind`` and the words the refusal must hold."""
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
        return str(path), "is a FIFO (named pipe); give a regular file"
    if kind == "dev_zero_symlink":
        path = tmp_path / "looks-like-a-file.jsonl"
        path.symlink_to("/dev/zero")
        return str(path), "(-> /dev/zero) is a character device; give a regular file"
    if kind == "directory":
        return str(tmp_path), "is a directory; give a regular file"
    if kind == "too_many_bytes":
        path = tmp_path / "big.jsonl"
        path.write_bytes(AGENT.read_bytes() * 2)  # over the 1024-byte bound of the test
        return str(path), "larger than 1024 bytes (RECOVERY_IMPORT_MAX_BYTES)"
    if kind == "too_many_lines":
        path = tmp_path / "long.jsonl"
        path.write_bytes(b"\n".join(AGENT.read_bytes().splitlines()[:3]))  # 3 lines, no final \n
        return str(path), "more than 2 lines (RECOVERY_IMPORT_MAX_LINES)"
    raise AssertionError(kind)


KINDS = ["fifo", "dev_zero_symlink", "directory", "too_many_bytes", "too_many_lines"]


@pytest.mark.django_db
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_path_is_refused_quickly_and_nothing_is_written(acme, tmp_path, settings,
                                                                   command, kind):
    fn, what = COMMANDS[command]
    path, words = _hostile(kind, tmp_path)
    if kind == "too_many_bytes":
        settings.RECOVERY_IMPORT_MAX_BYTES = 1024
    if kind == "too_many_lines":
        settings.RECOVERY_IMPORT_MAX_LINES = 2
    before = db_state()
    with pytest.raises(CommandError) as caught:
        _within_deadline(lambda: fn(path))
    assert str(caught.value).startswith(f"{what}: "), caught.value
    assert words in str(caught.value)
    assert db_diff(before, db_state()) == {}


@pytest.mark.django_db
@pytest.mark.parametrize(("bound", "value", "words"), [
    ("RECOVERY_IMPORT_MAX_BYTES", 1024, "file: larger than 1024 bytes"),
    ("RECOVERY_IMPORT_MAX_LINES", 2, "file: more than 2 lines"),
])
def test_standard_input_is_bounded_before_anything_is_written(acme, settings, monkeypatch,
                                                              bound, value, words):
    setattr(settings, bound, value)
    data = AGENT.read_bytes() * 2  # 6 lines, about 2.5 KB: over both bounds
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    before = db_state()
    with pytest.raises(CommandError, match=words):
        _within_deadline(lambda: _import("-"))
    assert db_diff(before, db_state()) == {}


@pytest.mark.django_db
def test_a_file_at_the_bounds_is_imported(acme, tmp_path, settings):
    data = AGENT.read_bytes()
    settings.RECOVERY_IMPORT_MAX_BYTES = max(len(data), 1024)
    settings.RECOVERY_IMPORT_MAX_LINES = 3
    path = tmp_path / "agent.jsonl"
    path.write_bytes(data)
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)  # a symlink to a regular file is a regular file
    out = io.StringIO()
    call_command("import_runifold", str(link), tenant="acme", no_progress=True, stdout=out,
                 stderr=io.StringIO())
    assert "3 line(s) imported" in out.getvalue()


def test_a_file_that_grows_after_it_was_counted_ends_where_it_was_counted(tmp_path):
    from checkpoints.ops.operatorfiles import open_input

    path = tmp_path / "growing.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    stream, size = open_input(str(path), max_bytes=1024, max_lines=2)
    with open(path, "ab") as more:
        more.write(b'{"a": 3}\n' * 100)
    with stream:
        assert size == 18
        assert stream.readline() == b'{"a": 1}\n'
        assert stream.read() == b'{"a": 2}\n'


# -- files the commands write (the attack of issue 17: ``export_runifold /dev/full`` as
# root replaced the device with a regular file; ``export_audit_head --out FIFO`` hung)

def _export_runifold(path: str) -> None:
    call_command("export_runifold", path, tenant="acme", no_progress=True,
                 stdout=io.StringIO(), stderr=io.StringIO())


def _export_head(path: str) -> None:
    call_command("export_audit_head", out=path, stdout=io.StringIO())


OUTPUTS = {"export_runifold": (_export_runifold, "file"),
           "export_audit_head": (_export_head, "--out")}


def _hostile_output(kind: str, tmp_path: Path) -> tuple[Path, str]:
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
        return path, "is a FIFO (named pipe); give a regular file"
    if kind == "device":  # a null device of the test's own (root), never a system one
        path = tmp_path / "null"
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root")
        return path, "is a character device; give a regular file"
    if kind == "symlink":
        path = tmp_path / "link.jsonl"
        path.symlink_to(tmp_path / "elsewhere.jsonl")
        return path, "is a symbolic link"
    if kind == "directory":
        return tmp_path, "is a directory; give a regular file"
    raise AssertionError(kind)


@pytest.mark.django_db
@pytest.mark.parametrize("command", list(OUTPUTS))
@pytest.mark.parametrize("kind", ["fifo", "device", "symlink", "directory"])
def test_an_export_to_anything_but_a_regular_file_is_refused_and_nothing_replaced(
        acme, tmp_path, command, kind):
    fn, what = OUTPUTS[command]
    path, words = _hostile_output(kind, tmp_path)
    mode = os.lstat(path).st_mode
    before = db_state()
    with pytest.raises(CommandError) as caught:
        _within_deadline(lambda: fn(str(path)))
    assert str(caught.value).startswith(f"{what}: "), caught.value
    assert words in str(caught.value)
    assert os.lstat(path).st_mode == mode  # still what it was: not replaced
    assert not list(tmp_path.glob("*.partial"))
    assert db_diff(before, db_state()) == {}


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["export_runifold", "export_keyring"])
@pytest.mark.parametrize("existing", [False, True])
def test_an_export_of_payloads_or_keys_is_readable_by_its_owner_only(
        acme, tmp_path, command, existing):
    """(stop 34, an attack's doubt) ``export_runifold`` writes decrypted payloads and
    ``export_keyring`` the wrapped data keys: both were ``-rw-r--r--`` under the usual
    umask. Each file is 0600, a new one and one written over alike."""
    path = tmp_path / "out.jsonl"
    if existing:
        path.write_text("old\n")
        path.chmod(0o644)
    old_umask = os.umask(0o022)
    try:
        if command == "export_runifold":
            _export_runifold(str(path))
        else:
            call_command("export_keyring", out=str(path), force=existing,
                         stdout=io.StringIO())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() != "old\n"


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["export_runifold", "export_keyring"])
def test_an_export_never_writes_through_a_link_at_its_partial_name(acme, tmp_path, command):
    """(stop 34's second attack) ``export_keyring`` checked ``--out`` but not
    ``<out>.partial``: a link there had the wrapped keys written into its target, then
    narrowed to 0600. Both exports refuse it, and the target is untouched."""
    victim = tmp_path / "shared.txt"
    victim.write_text("shared data\n")
    victim.chmod(0o644)
    out = tmp_path / "out.jsonl"
    os.symlink(victim, f"{out}.partial")
    with pytest.raises(CommandError, match="is a symbolic link"):
        if command == "export_runifold":
            _export_runifold(str(out))
        else:
            call_command("export_keyring", out=str(out), stdout=io.StringIO())
    assert victim.read_text() == "shared data\n"
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o644
    assert not out.exists()


def test_open_private_never_follows_a_link(tmp_path):
    from checkpoints.ops.operatorfiles import open_private

    victim = tmp_path / "victim"
    victim.write_text("x")
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(OSError):
        open_private(str(tmp_path / "link"))
    assert victim.read_text() == "x"


class _Full(io.RawIOBase):
    """A stream whose every write fails as a full disk does."""

    def writable(self):
        return True

    def write(self, b):
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.django_db
def test_an_export_whose_output_fails_is_a_clear_error(acme, monkeypatch):
    _import(str(AGENT))  # something to export
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BufferedWriter(_Full())))
    with pytest.raises(CommandError, match=r"^file: cannot write - \(No space left"):
        call_command("export_runifold", "-", tenant="acme", no_progress=True,
                     stderr=io.StringIO())
    with pytest.raises(CommandError, match=r"^stdout: cannot write standard output"):
        call_command("export_audit_head", stdout=io.TextIOWrapper(_Full()))


def test_the_makefiles_mutant_selection_names_files_that_exist():
    """A newcomer's finding: `make mutants` named checkpoints/selectors.py after the
    selectors became a package, and failed at its first step."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    text = (root / "Makefile").read_text()
    full = re.search(r"^MUTANTS_FULL \?= (.*)$", text, re.M).group(1).split()
    sample = re.search(r"^MUTANTS_SAMPLE \?= (.*)$", text, re.M).group(1).split()
    paths = [f"checkpoints/{m}.py" for m in full] + [s.rsplit(":", 1)[0] for s in sample]
    assert [p for p in paths if not (root / p).is_file()] == []


@pytest.mark.django_db
def test_export_keyring_refuses_to_replace_a_keyring_without_force(acme, tmp_path):
    """(the operator's walk, item 3) ``export_keyring --out`` replaced an existing file
    without a word, where ``export_audit_head --out`` appends: a keyring kept beside older
    backups is precious. Refused, naming ``--out`` and ``--force``, the file untouched and
    no ``.partial`` left; ``--force`` replaces it."""
    path = tmp_path / "keyring.jsonl"
    path.write_text("the keyring of last week\n")
    with pytest.raises(CommandError) as caught:
        call_command("export_keyring", out=str(path), stdout=io.StringIO())
    assert str(caught.value).startswith("--out: ") and "--force" in str(caught.value)
    assert path.read_text() == "the keyring of last week\n"
    assert not list(tmp_path.glob("*.partial"))
    call_command("export_keyring", out=str(path), force=True, stdout=io.StringIO())
    assert "key_id" in path.read_text()
    fresh = tmp_path / "new.jsonl"
    call_command("export_keyring", out=str(fresh), stdout=io.StringIO())
    assert fresh.read_text() == path.read_text()
