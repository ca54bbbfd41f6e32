"""Writing an output file without destroying anything: the one way vpp writes logits, traces, PNGs and
results.

What a target may be, checked before any work (:func:`check_output_file`) and again at the write:

- absent (its folder exists and is writable): created with mode ``0o666 & ~umask``, as ``open`` would;
- a regular file with write permission: replaced by rename, keeping its mode;
- a symlink: followed to its final target, which must itself be absent or a regular file. The link stays a
  link (the target is written, not the link); a dangling link, a loop or a link to a special file is refused.
- anything else (a directory, a character or block device such as ``/dev/null``, a FIFO, a socket) or a
  read-only regular file (mode without any write bit: refused even for root, who ``os.access`` lets
  through): refused with one line, :class:`OutputPathError`.

The write goes to a temporary file in the same folder as the resolved target, which is then renamed over it
(``os.replace``): a reader sees the old file or the new one, never half of one, and a failure leaves the old
file as it was. The rename happens only when the target is, at that moment, absent or still a regular file.
Pure Python (standard library only): every room of vpp, the pure ``plan`` included, reaches it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile

__all__ = ["OutputPathError", "check_output_file", "check_output_dir", "atomic_open", "write_bytes",
           "write_text", "current_umask"]


class OutputPathError(ValueError):
    """An output path vpp will not write: names the path and why, in one line."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _resolve(path: str) -> str:
    """The final target of ``path`` (following every symlink); refuses dangling links and loops."""
    path = os.fspath(path)
    if not os.path.islink(path):
        return os.path.abspath(path)
    try:
        real = os.path.realpath(path, strict=True)
    except FileNotFoundError:
        # a link whose target does not exist: refuse rather than guess where a chain of links ends
        raise OutputPathError(f"{path}: a symlink to {os.readlink(path)!r}, which does not exist") from None
    except OSError as exc:
        raise OutputPathError(f"{path}: a symlink that cannot be resolved ({exc.strerror or exc})") from None
    return real


def check_output_file(path, option: str | None = None) -> str:
    """The resolved path ``path`` would be written to; :class:`OutputPathError` (one line, the path and the
    reason, prefixed by ``option`` if given) when it is not a new or writable regular file."""
    name = f"{option} {path}" if option else str(path)
    try:
        real = _resolve(path)
    except OutputPathError as exc:
        raise OutputPathError(f"{option} {exc}" if option else str(exc)) from None
    via = f" (a symlink to {real})" if real != os.path.abspath(os.fspath(path)) else ""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputPathError(f"{name}{via}: cannot be inspected ({exc.strerror or exc})") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise OutputPathError(f"{name}{via}: is {_kind(st.st_mode)}, not a regular file; vpp writes only "
                                  f"new or regular files")
        if not st.st_mode & 0o222 or not os.access(real, os.W_OK):
            raise OutputPathError(f"{name}{via}: is read-only (mode {stat.S_IMODE(st.st_mode):04o})")
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise OutputPathError(f"{name}{via}: the folder {folder} does not exist")
    if not _can_write_in(folder):
        raise OutputPathError(f"{name}{via}: the folder {folder} is not writable")
    return real


def check_output_dir(path, option: str | None = None) -> str:
    """``path`` is a writable folder (a symlink to one is followed) or can be created as one: returns the
    resolved path, or raises :class:`OutputPathError`."""
    name = f"{option} {path}" if option else str(path)
    if os.path.islink(path) and not os.path.exists(path):
        raise OutputPathError(f"{name}: a symlink to {os.readlink(path)!r}, which does not exist")
    probe = os.path.realpath(path)
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        mode = os.stat(probe).st_mode
    except OSError as exc:
        raise OutputPathError(f"{name}: {probe} cannot be inspected ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(mode):
        raise OutputPathError(f"{name}: {probe} is {'a file' if stat.S_ISREG(mode) else _kind(mode)}, not a folder")
    if not _can_write_in(probe):
        raise OutputPathError(f"{name}: {probe} is not writable")
    return os.path.realpath(path)


def _can_write_in(folder: str) -> bool:
    """Try it (permission bits say nothing for root, nor about read-only file systems)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but only where /proc is missing)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", *, option: str | None = None):
    """Open a temporary file beside ``path``'s resolved target for writing; on a clean exit it is flushed,
    given the mode the target would have (the existing file's, else ``0o666 & ~umask``) and renamed over
    the target. On an exception the temporary file is removed and the target is untouched."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    real = check_output_file(path, option)
    folder, base = os.path.split(real)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, real, path, option)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _replace(tmp: str, real: str, path, option: str | None) -> None:
    """Rename ``tmp`` over ``real`` only if ``real`` is still absent or a regular file."""
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # changed since the check: do not replace it
        name = f"{option} {path}" if option else str(path)
        raise OutputPathError(f"{name}: became {_kind(st.st_mode)} while vpp was writing; left untouched")
    os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~current_umask())
    os.replace(tmp, real)


def write_bytes(path, data: bytes, *, option: str | None = None) -> str:
    """Write ``data`` to ``path`` as :func:`atomic_open` does; returns the resolved path written."""
    with atomic_open(path, "wb", option=option) as f:
        f.write(data)
    return _resolve(path)


def write_text(path, text: str, *, option: str | None = None) -> str:
    with atomic_open(path, "w", option=option) as f:
        f.write(text)
    return _resolve(path)
