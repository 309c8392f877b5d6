"""Reading the user's files and writing ours, safely: the one place ddlsim touches the disk.

Reading (:func:`read_text`) refuses, with a one-paragraph :class:`InputFileError`, anything
that is not a readable regular UTF-8 text file of bounded size: a missing path, a directory, a
FIFO or device (which would block or never end), a file over the size limit, a binary file, or
text in another encoding. Nothing is read before those checks.

Writing (:func:`write_output`) writes what the user named and loses nothing:

* ``-`` is standard output;
* a regular file is replaced atomically (a temporary file in the same directory, then a
  rename), and only with ``force`` when it exists; a new file gets the user's umask, a
  replaced one keeps its mode;
* a symbolic link is followed: the file it points to is written, the link stays a link;
* a FIFO, a character or block device (``/dev/null``) is written through, never replaced;
* a directory is refused.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from .errors import DDLSimError

__all__ = ["InputFileError", "OutputFileError", "read_text", "read_bytes", "write_output",
           "check_output", "MAX_CONFIG_BYTES", "MAX_DATA_BYTES"]

#: Largest run config or model file read (a real one is a few KiB).
MAX_CONFIG_BYTES = 4 * 2**20
#: Largest benchmark output (nccl-tests, OSU, CSV) or calibration profile read.
MAX_DATA_BYTES = 64 * 2**20


class InputFileError(DDLSimError, ValueError):
    """A file the user gave cannot be read as text of the expected kind."""


class OutputFileError(DDLSimError, OSError):
    """An output path cannot be written as asked."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | Path, *, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Raises :class:`InputFileError` naming the path and the reason (missing, a directory, a
    FIFO or device, unreadable, larger than ``max_bytes``).
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputFileError(f"{what} {str(p)!r} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {str(p)!r} is {_kind(st.st_mode)}; give a regular file")
    if st.st_size > max_bytes:
        raise InputFileError(f"{what} {str(p)!r} has {st.st_size:,} bytes, more than the "
                             f"{max_bytes:,} allowed for a {what}")
    try:
        # O_NONBLOCK: a path swapped for a FIFO after the check still cannot block the open.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputFileError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None
    # read in pieces: ``read(max_bytes + 1)`` would allocate the whole limit up front, even
    # for an empty file (a MemoryError under an address-space limit)
    chunks, total = [], 0
    with os.fdopen(fd, "rb") as fh:
        while total <= max_bytes:
            chunk = fh.read(min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {str(p)!r} has more than the {max_bytes:,} bytes allowed "
                             f"for a {what}")
    return data


def read_text(path: str | Path, *, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of ``path`` (see :func:`read_bytes` for the checks).

    Raises :class:`InputFileError` for binary content (NUL bytes), UTF-16/32 (by their byte
    order marks) or any other non-UTF-8 encoding, naming the line and column of the first bad
    byte.
    """
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    name = str(path)
    for bom, enc in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                     (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
        if data.startswith(bom):
            raise InputFileError(f"{what} {name!r} is {enc} text; save it as UTF-8")
    if b"\x00" in data:
        raise InputFileError(f"{what} {name!r} is a binary file (it contains NUL bytes), not "
                             "UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputFileError(f"{what} {name!r} is not UTF-8 text: byte 0x{data[exc.start]:02x} "
                             f"at line {line}, column {col}; save it as UTF-8") from None
    return text.removeprefix("\ufeff")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output(path: str | Path, force: bool, *, what: str = "output") -> None:
    """Raise :class:`OutputFileError` now if :func:`write_output` would refuse ``path`` later
    (so a long run is not wasted): an existing regular file without ``force``, a directory."""
    if str(path) == "-":
        return
    p = Path(path)
    try:
        st = p.stat()  # follows a symlink to what it points at
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputFileError(f"{what} {str(p)!r} cannot be written: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputFileError(f"{what} {str(p)!r} is a directory; name a file")
    if stat.S_ISREG(st.st_mode) and not force:
        raise OutputFileError(f"{what} {str(p)!r} already exists; pass --force to replace it, "
                              "or choose another path")


def write_output(path: str | Path, data: str | bytes, *, force: bool = False,
                 what: str = "output") -> None:
    """Write ``data`` to ``path`` as described in the module docstring.

    Raises :class:`OutputFileError` naming the path and the reason.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if str(path) == "-":
        sys.stdout.buffer.write(raw) if hasattr(sys.stdout, "buffer") else sys.stdout.write(
            raw.decode("utf-8"))
        sys.stdout.flush()
        return
    check_output(path, force, what=what)
    p = Path(path)
    target = Path(os.path.realpath(p)) if p.is_symlink() else p
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputFileError(f"{what} {str(p)!r} cannot be written: {exc.strerror}") from None
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, "wb") as fh:  # a FIFO or device: write through, never replace
                fh.write(raw)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        raise OutputFileError(f"{what} {str(p)!r} cannot be written: "
                              f"{exc.strerror or exc}") from None
