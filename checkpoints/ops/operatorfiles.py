"""Files an operator command reads (issue 17, item 9): a regular file or standard input,
bounded in size and lines, checked before anything is written.

``manage.py import_runifold FILE`` and ``verify_audit_chain --against FILE`` read what an
operator names, and a path may name a device, a FIFO or a directory (``/dev/zero`` behind
a symlink reads forever; opening a FIFO blocks until someone writes to it). So:

- ``-`` is standard input; any other path is resolved (symlinks followed) and must be a
  regular file (``os.stat`` / ``S_ISREG``). It is opened with ``O_NONBLOCK`` (opening a
  FIFO that appeared after the check cannot block) and checked again on the open
  descriptor (``os.fstat``), so a path swapped between the two is refused too.
- At most ``max_bytes`` bytes (default ``RECOVERY_IMPORT_MAX_BYTES``) and ``max_lines``
  lines (default ``RECOVERY_IMPORT_MAX_LINES``; a last line without ``\\n`` counts).
  Both are checked on the whole input before the caller reads its first line: a file by
  one pass over it, standard input by copying it to a temporary file (on disk beyond
  8 MiB), so a refused input writes nothing. What was counted is all that is read: a
  file that grows meanwhile ends where it was counted.

Files an operator command writes (``export_runifold FILE``, ``export_audit_head --out``)
pass ``check_output``: a path that exists must be a regular file (a symlink is refused
too: it is written through, or replaced), so a device, a FIFO or a directory is refused
before anything is exported, never replaced or blocked on (``/dev/full`` was replaced by a
regular file as root; a FIFO hung). ``write_error`` turns a failed write (a full disk, a
closed pipe) into the same kind of error.

Every refusal is a ``CommandError`` naming the argument and the rule.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import tempfile
from typing import IO

from django.conf import settings
from django.core.management.base import CommandError

_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a regular file"


def _refuse_irregular(what: str, path: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        resolved = os.path.realpath(path)
        shown = path if resolved == os.path.abspath(path) else f"{path} (-> {resolved})"
        raise CommandError(f"{what}: {shown} is {_kind(mode)}; give a regular file, "
                           f"or - for standard input")


def _too_big(what: str, max_bytes: int) -> CommandError:
    return CommandError(f"{what}: larger than {max_bytes} bytes (RECOVERY_IMPORT_MAX_BYTES)")


def _too_long(what: str, max_lines: int) -> CommandError:
    return CommandError(f"{what}: more than {max_lines} lines (RECOVERY_IMPORT_MAX_LINES)")


def _count(stream: IO[bytes], what: str, max_bytes: int, max_lines: int,
           copy_to: IO[bytes] | None = None) -> int:
    """Read ``stream`` to its end in 1 MiB pieces (optionally copying it), refusing it as
    soon as it passes either bound. Returns its size in bytes."""
    size = lines = 0
    last = b"\n"
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise _too_big(what, max_bytes)
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        if lines > max_lines or (lines == max_lines and last != b"\n"):
            # (the second: more bytes after the last allowed line ending)
            raise _too_long(what, max_lines)
        if copy_to is not None:
            copy_to.write(chunk)
    if last != b"\n":
        lines += 1
    if lines > max_lines:
        raise _too_long(what, max_lines)
    return size


def open_input(path: str, *, what: str = "file", stdin: IO[bytes] | None = None,
               max_bytes: int | None = None,
               max_lines: int | None = None) -> tuple[IO[bytes], int]:
    """Open ``path`` (``-``: standard input, or ``stdin`` when given) for reading bytes,
    checked as the module doc says; ``what`` names the argument in errors (``"file"``,
    ``"--against"``).

    Returns ``(stream, size)``: a binary stream positioned at the start that ends after
    ``size`` bytes (its size when counted), which the caller closes. Raises ``CommandError`` for a path that cannot be read,
    that is not a regular file, or an input over either bound.
    """
    max_bytes = settings.RECOVERY_IMPORT_MAX_BYTES if max_bytes is None else max_bytes
    max_lines = settings.RECOVERY_IMPORT_MAX_LINES if max_lines is None else max_lines
    if path == "-":
        source = stdin if stdin is not None else sys.stdin.buffer
        spool = tempfile.SpooledTemporaryFile(max_size=8 * _CHUNK)  # noqa: SIM115 - returned
        try:
            size = _count(source, what, max_bytes, max_lines, copy_to=spool)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool, size
    try:
        _refuse_irregular(what, path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CommandError(f"{what}: cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        _refuse_irregular(what, path, info.st_mode)
        if info.st_size > max_bytes:
            raise _too_big(what, max_bytes)
        os.set_blocking(fd, True)
        stream = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    try:
        size = _count(stream, what, max_bytes, max_lines)
        stream.seek(0)
    except BaseException:
        stream.close()
        raise
    return io.BufferedReader(_Capped(stream, size), buffer_size=_CHUNK), size


class _Capped(io.RawIOBase):
    """``stream`` ending after ``size`` bytes: what was counted is all that is read,
    even when the file grows while it is imported (a log still being written)."""

    def __init__(self, stream: IO[bytes], size: int):
        super().__init__()
        self._stream, self._left = stream, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._left <= 0:
            return 0
        data = self._stream.read(min(len(buffer), self._left))
        buffer[:len(data)] = data
        self._left -= len(data)
        return len(data)

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        self._stream.close()
        super().close()


def check_output(path: str, *, what: str = "file") -> None:
    """Refuse ``path`` as a file to write unless it does not exist yet or is a regular
    file (not through a symlink): ``CommandError`` naming ``what`` and what the path is.
    ``-`` (standard output) is the caller's to handle. The directory it would go in must
    exist."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise CommandError(f"{what}: cannot write {path} ({parent} is not a "
                               f"directory)") from None
        return
    except OSError as exc:
        raise CommandError(f"{what}: cannot write {path} ({exc.strerror})") from None
    if stat.S_ISLNK(mode):
        raise CommandError(f"{what}: {path} is a symbolic link; give the regular file it "
                           f"names, or a new path")
    if not stat.S_ISREG(mode):
        raise CommandError(f"{what}: {path} is {_kind(mode)}; give a regular file, "
                           f"or - for standard output")


def open_private(path: str, mode: str = "wb") -> IO:
    """``path`` opened for writing (``mode``: ``"wb"`` or ``"w"``, UTF-8), created or
    emptied, readable by its owner only (0600 whatever the umask): what an export holding
    decrypted payloads or wrapped data keys writes (``export_runifold``,
    ``export_keyring``; an attack found them ``-rw-r--r--``, stop 34). An existing file
    keeps its owner and is narrowed to 0600 too; a symbolic link is never followed (its
    target would be written and narrowed: stop 34's second attack). Raises ``OSError``
    (``ELOOP`` for a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


def write_error(what: str, target: str, exc: OSError) -> CommandError:
    """The ``CommandError`` for a write that failed (``ENOSPC``, ``EPIPE`` ...)."""
    return CommandError(f"{what}: cannot write {target} ({exc.strerror or exc})")
