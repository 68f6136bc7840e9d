"""Build a C source of this package into a shared library once per machine and load it.

The library is cached under ``$TORCHDEBUG_CACHE_DIR`` (default ``$XDG_CACHE_HOME/torchdebug`` or
``~/.cache/torchdebug``) in a folder named after a hash of the source (and the headers beside it
that it includes), the compiler, the flags and the machine, so an edited source or a new compiler
builds anew. Processes that need it at once (the ranks of one job, the workers of a test run) build
it once: the first holds the folder's lock while it compiles, the others wait and load what it
built. It is compiled to a temporary name and renamed into place, so no process ever loads a
half-written file. Any failure is logged once and gives ``None``: callers then use torch ops.

Where torch runs its CPU threads on GNU OpenMP, the library is built with ``-fopenmp``: its
``libgomp.so.1`` is then the copy torch already loaded, so its parallel regions run on torch's own
thread pool (a second pool would fight torch's for the cores). Elsewhere, or if that build fails,
it is built without and runs on one thread.

A C++ source that uses torch's C++ API (:func:`load_torch_library`) is built with the C++ compiler
against the installed torch, cached per torch version; a CPython extension module
(:func:`load_torch_extension`) also against Python's headers and torch's bindings, and imported; a C
source that reads Python's own structures (:func:`load_python_library`) against Python's headers.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger("torchdebug.native")

FLAGS = ("-O3", "-shared", "-fPIC", "-std=c99")

OPENMP_FLAGS = ("-fopenmp",)

PYTHON_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")
"""CPython's internal headers are C11."""

CXX_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++20")
"""torch's headers need C++17 (2.11) or C++20 (2.13 on): C++20 serves all."""

DISABLE_ENV = "TORCHDEBUG_NATIVE"
"""Set to ``0`` to never build or load native kernels (torch ops are used instead)."""


def cache_dir() -> Path:
    """Where built libraries are kept."""
    explicit = os.environ.get("TORCHDEBUG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "torchdebug"


def _find_compiler(variable: str, names: tuple[str, ...]) -> list[str] | None:
    """The compiler ``$variable`` (or Python's build configuration) names, else the first of
    ``names`` on the PATH; ``None`` when there is none."""
    configured = os.environ.get(variable) or sysconfig.get_config_var(variable) or names[0]
    command = shlex.split(configured)
    if command and shutil.which(command[0]):
        return command
    for name in names:
        if shutil.which(name):
            return [name]
    return None


def _compiler() -> list[str] | None:
    return _find_compiler("CC", ("cc", "gcc", "clang"))


def _cxx_compiler() -> list[str] | None:
    return _find_compiler("CXX", ("c++", "g++", "clang++"))


def _torch_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(compile flags, link flags)`` that build against the installed torch: its headers, the C++
    ABI its libraries were built with, ``NDEBUG`` as they were (some classes have debug-only fields:
    ``RecordFunction``'s), and ``libc10``/``libtorch_cpu`` found where torch keeps them."""
    root = Path(torch.__file__).parent
    abi = int(torch.compiled_with_cxx11_abi())
    compile_flags = (f"-I{root / 'include'}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DNDEBUG")
    lib = root / "lib"
    return compile_flags, (f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu")


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
    found = _c_source(source_name)
    if found is None:
        return None
    compiler, source = found
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


@functools.cache
def load_python_library(source_name: str) -> ctypes.CDLL | None:
    """As :func:`load_library`, built against the running Python's headers (its internal ones too:
    the source defines ``Py_BUILD_CORE``) and cached per Python version, as their structures may
    change between releases."""
    found = _c_source(source_name)
    if found is None:
        return None
    compiler, source = found
    try:
        flags = (*PYTHON_FLAGS, f"-I{sysconfig.get_paths()['include']}")
        return ctypes.CDLL(str(_built(compiler, flags, source, version=platform.python_version())))
    except (OSError, subprocess.SubprocessError) as failure:
        logger.warning("could not build %s (%s); torchdebug uses Python instead", source.name, failure)
        return None


def _c_source(source_name: str) -> tuple[list[str], Path] | None:
    """The C compiler and ``torchdebug/native/<source_name>.c``, or ``None`` (said) when native
    kernels are disabled or there is no compiler."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found; torchdebug uses Python for %s", source_name)
        return None
    return compiler, Path(__file__).with_name(f"{source_name}.c")


@functools.cache
def load_torch_library(source_name: str) -> ctypes.CDLL | None:
    """The shared library built from ``torchdebug/native/<source_name>.cpp`` against the installed
    torch (cached per torch version), or ``None`` when it cannot be built here (no C++ compiler, a
    build error) or native kernels are disabled. It is loaded with :class:`ctypes.CDLL`.
    """
    built = _built_against_torch(source_name)
    try:
        return None if built is None else ctypes.CDLL(str(built))
    except OSError as failure:
        logger.warning("could not load %s (%s); torchdebug uses Python instead", built, failure)
        return None


@functools.cache
def load_torch_extension(source_name: str) -> ModuleType | None:
    """The CPython extension module built from ``torchdebug/native/<source_name>.cpp`` (its
    ``PyInit_<source_name>``) against the installed torch and this Python (cached per torch version
    and Python ABI), imported; ``None`` when it cannot be built or imported here, or native kernels
    are disabled. Its functions take Python tensors directly: no ctypes between them and the caller.
    """
    built = _built_against_torch(source_name, (f"-I{sysconfig.get_paths()['include']}",), ("-ltorch_python",))
    if built is None:
        return None
    try:
        spec = importlib.util.spec_from_file_location(source_name, built)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {built}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError as failure:
        logger.warning("could not import %s (%s); torchdebug uses Python instead", built, failure)
        return None


def _built_against_torch(source_name: str, flags: tuple[str, ...] = (), link: tuple[str, ...] = ()) -> Path | None:
    """The library built from ``torchdebug/native/<source_name>.cpp`` against the installed torch
    (with ``flags`` and ``link`` besides torch's), from the cache or built now; ``None`` (said once)
    when it cannot be built here or native kernels are disabled."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    source = Path(__file__).with_name(f"{source_name}.cpp")
    compiler = _cxx_compiler()
    if compiler is None:
        logger.info("no C++ compiler found; torchdebug uses Python for %s", source_name)
        return None
    compile_flags, link_flags = _torch_flags()
    try:
        return _built(compiler, (*CXX_FLAGS, *compile_flags, *flags), source, (*link_flags, *link), torch.__version__)
    except (OSError, subprocess.SubprocessError) as failure:
        logger.warning("could not build %s (%s); torchdebug uses Python instead", source.name, failure)
        return None


def _built(compiler: list[str], flags: tuple[str, ...], source: Path, link: tuple[str, ...] = (), version: str = "") -> Path:
    """The library built from ``source`` with ``flags`` (and ``link``: libraries after the source),
    from the cache or built now; ``version`` (torch's for a C++ source, Python's for one read against
    Python's headers) is part of the cache key."""
    key = hashlib.sha256()
    if link or version:
        key.update(" ".join([*link, version]).encode())
    for part in (
        source.read_bytes(),
        *(header.read_bytes() for header in local_headers(source)),
        " ".join([*compiler, *flags]).encode(),
        _compiler_version(compiler).encode(),
        platform.machine().encode(),
        str(sysconfig.get_config_var("EXT_SUFFIX")).encode(),
    ):
        key.update(part)
    target = cache_dir() / key.hexdigest()[:16] / f"{source.stem}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked(target.parent / "build.lock"):
            if not target.exists():  # else another process built it while this one waited
                _build(compiler, flags, source, target, link)
    return target


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def local_headers(source: Path) -> list[Path]:
    """The headers beside ``source`` that it includes with quotes, and theirs, in the order first
    included: part of the cache key, so an edited header builds its sources anew."""
    found: list[Path] = []
    pending = [source]
    while pending:
        for name in _LOCAL_INCLUDE.findall(pending.pop().read_bytes()):
            header = source.parent / name.decode()
            if header not in found and header.is_file():
                found.append(header)
                pending.append(header)
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (released when the holder ends, however it ends); where
    there are no advisory locks (Windows), none: each process builds, and the rename keeps that safe."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(compiler: list[str], flags: tuple[str, ...], source: Path, target: Path, link: tuple[str, ...] = ()) -> None:
    fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        result = subprocess.run(
            [*compiler, *flags, "-o", temporary, str(source), *link, "-lm"], capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            raise OSError(f"{compiler[0]} exited with {result.returncode}: {result.stderr.strip()[-500:]}")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
