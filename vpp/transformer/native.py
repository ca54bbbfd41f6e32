"""vpp's C++ CPU kernels, built and loaded: the compiler run at first use into the cache directory
(named by a hash of the source and the flags, renamed into place atomically, so ranks building at once
each end with a whole library), the ``auto|vpp|torch`` switches, and loading a library once per
process. Used by :mod:`vpp.transformer.attention.cpu_kernel` (attention) and
:mod:`vpp.transformer.cpu_ops` (MoE, RMSNorm, RoPE)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-pthread", "-fno-math-errno", "-ffp-contract=off")
# (-ffp-contract=off: a product and a sum written apart stay apart, rounded as torch rounds them; fused
# multiply-adds are written as such)
MODES = ("auto", "vpp", "torch")


def mode(env: str) -> str:
    """A kernel's switch ``env`` (``VPP_CPU_ATTENTION``, ``VPP_CPU_OPS``): ``auto`` (default: the kernel
    where it runs, else torch's), ``vpp`` (the kernel or an error) or ``torch`` (always torch's)."""
    value = os.environ.get(env, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{env}={value!r} is not one of {MODES}")
    return value


def cache_dir() -> Path:
    explicit = os.environ.get("VPP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vpp"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(source: Path, stem: str, directory: Path | None = None, compiler: str | None = None) -> Path:
    """Compile ``source`` into ``directory`` (default :func:`cache_dir`) as ``stem_<hash>.so``, or find it
    already compiled, and return its path; raises RuntimeError (one line, the compiler's last message)
    where it cannot."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"the kernel is x86-64 AVX-512 code; this machine is {platform.machine()}")
    compiler = compiler or _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler ($CXX, g++ or c++) on PATH")
    text = source.read_bytes()
    key = hashlib.sha256(text + " ".join((os.path.basename(compiler),) + FLAGS).encode()).hexdigest()[:16]
    directory = Path(directory or cache_dir())
    target = directory / f"{stem}_{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *FLAGS, str(source), "-o", tmp, "-lm"], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise RuntimeError(f"{os.path.basename(compiler)} exited with {proc.returncode} building {source.name}: "
                               f"{last}")
        os.replace(tmp, target)  # atomic: ranks building at once each finish a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_once(state: dict, lock: threading.Lock, load, what: str, instead: str) -> ctypes.CDLL | None:
    """``state["lib"]``: ``load()``'s library, loaded once per process, or None where it cannot run here
    (``state["why"]`` says why, logged once: "``what`` is not used (why); ``instead``")."""
    if "lib" not in state:
        with lock:
            if "lib" not in state:
                try:
                    state["lib"], state["why"] = load(), None
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    state["lib"], state["why"] = None, str(exc)
                    log.warning("%s is not used (%s); %s", what, exc, instead)
    return state["lib"]


def usable(env: str, fits: bool, library, state: dict, what: str) -> bool:
    """Whether a kernel runs for arguments that ``fits`` it: the switch ``env`` lets it and ``library()``
    loads here. With ``env=vpp`` a library that cannot run is an error naming ``what`` and
    ``state["why"]`` instead of a fallback."""
    want = mode(env)
    if want == "torch" or not fits:
        return False
    if library() is None:
        if want == "vpp":
            raise RuntimeError(f"{env}=vpp but {what} cannot run here: {state['why']}")
        return False
    return True


__all__ = ["FLAGS", "MODES", "build", "cache_dir", "load_once", "mode", "usable"]
