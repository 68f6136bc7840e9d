"""Build a C source of this package into a shared library once per machine and load it.

The library is cached under ``$TORCHDEBUG_CACHE_DIR`` (default ``$XDG_CACHE_HOME/torchdebug`` or
``~/.cache/torchdebug``) in a folder named after a hash of the source, the compiler, the flags and
the machine, so an edited source or a new compiler builds anew. It is compiled to a temporary
name and renamed into place, so processes building at once (the ranks of one job) never load a
half-written file. Any failure is logged once and gives ``None``: callers then use torch ops.

Where torch runs its CPU threads on GNU OpenMP, the library is built with ``-fopenmp``: its
``libgomp.so.1`` is then the copy torch already loaded, so its parallel regions run on torch's own
thread pool (a second pool would fight torch's for the cores). Elsewhere, or if that build fails,
it is built without and runs on one thread.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger("torchdebug.native")

FLAGS = ("-O3", "-shared", "-fPIC", "-std=c99")

OPENMP_FLAGS = ("-fopenmp",)

DISABLE_ENV = "TORCHDEBUG_NATIVE"
"""Set to ``0`` to never build or load native kernels (torch ops are used instead)."""


def cache_dir() -> Path:
    """Where built libraries are kept."""
    explicit = os.environ.get("TORCHDEBUG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "torchdebug"


def _compiler() -> list[str] | None:
    configured = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    command = shlex.split(configured)
    if command and shutil.which(command[0]):
        return command
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def _compiler_version(compiler: list[str]) -> str:
    try:
        return subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def torch_uses_gnu_openmp() -> bool:
    """Whether torch's CPU thread pool is GNU OpenMP and its ``libgomp`` is loaded in this process
    (Linux; elsewhere ``False``)."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("/libgomp" in line for line in maps)
    except OSError:
        return False


@functools.cache
def load_library(source_name: str) -> ctypes.CDLL | None:
    """The shared library built from ``torchdebug/native/<source_name>.c``, or ``None`` when it
    cannot be built here (no compiler, a build error) or native kernels are disabled. It is loaded
    with :class:`ctypes.CDLL` (calls release the GIL).
    """
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    source = Path(__file__).with_name(f"{source_name}.c")
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found; torchdebug uses Python for %s", source_name)
        return None
    if torch_uses_gnu_openmp():
        variants = [(*FLAGS, *OPENMP_FLAGS), FLAGS]
    else:
        variants = [FLAGS]
    error: Exception | None = None
    for flags in variants:
        try:
            return ctypes.CDLL(str(_built(compiler, flags, source)))
        except (OSError, subprocess.SubprocessError) as failure:
            error = failure
    logger.warning("could not build %s (%s); torchdebug uses Python or torch ops instead", source.name, error)
    return None


def _built(compiler: list[str], flags: tuple[str, ...], source: Path) -> Path:
    """The library built from ``source`` with ``flags``, from the cache or built now."""
    key = hashlib.sha256()
    for part in (
        source.read_bytes(),
        " ".join([*compiler, *flags]).encode(),
        _compiler_version(compiler).encode(),
        platform.machine().encode(),
        str(sysconfig.get_config_var("EXT_SUFFIX")).encode(),
    ):
        key.update(part)
    target = cache_dir() / key.hexdigest()[:16] / f"{source.stem}.so"
    if not target.exists():
        _build(compiler, flags, source, target)
    return target


def _build(compiler: list[str], flags: tuple[str, ...], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        result = subprocess.run(
            [*compiler, *flags, "-o", temporary, str(source), "-lm"], capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            raise OSError(f"{compiler[0]} exited with {result.returncode}: {result.stderr.strip()[-500:]}")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
