"""Package-wide rules: cheap import, lazy public API, layering, private torch APIs in one place."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchdebug

PACKAGE = Path(torchdebug.__file__).parent

# Layers from the bottom up, as docs/architecture.md draws them; a module may import only from its own
# layer or lower ones, at module level, inside a function or under TYPE_CHECKING alike.
LAYERS = [
    {
        "errors",
        "version",
        "_torch",
        "callable_package",
        "options",
        "records",
        "native",
        "stats",
        "stats_table",
        "checksum",
        "config",
        "dist",
        "seed",
        "scope",
        "slots",
        "extras",
        "progress",
        "nonfinite",
        "gc_paused",
    },
    {"store"},
    {"report"},
    {"compare"},
    {"capture", "graph_dump"},
    {"compile"},
    {"debugger"},
    {"monitor"},
    {"integrations"},
    {"diagnose"},
    {"cli", "__main__", "__init__"},
]


def _layer(part: str) -> int:
    for index, layer in enumerate(LAYERS):
        if part in layer:
            return index
    raise AssertionError(f"torchdebug.{part} is in no layer; add it to LAYERS in tests/test_package.py")


def _imports(path: Path) -> set[tuple[str, int]]:
    """Every torchdebug import of a module, with its line: at module level, in functions and under
    ``TYPE_CHECKING`` (a type-only import upward is still a dependency upward)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchdebug."):
            names.add((node.module.split(".")[1], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module == "torchdebug" and node.level == 0:
            names |= {(a.name, node.lineno) for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.name.split(".")[1], node.lineno) for a in node.names if a.name.startswith("torchdebug.")}
            names |= {("__init__", node.lineno) for a in node.names if a.name == "torchdebug"}
    return names


def test_import_torchdebug_does_not_import_torch():
    code = "import sys, torchdebug; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False"


def test_every_public_name_is_the_object_its_module_defines():
    import importlib

    for name, module in torchdebug._EXPORTS.items():
        value, defined = getattr(torchdebug, name), getattr(importlib.import_module(module), name)
        # torchdebug.compare / .diagnose may be their callable package once a submodule was imported
        package = getattr(value, "__name__", None) == module and callable(value)
        assert value is defined or package, name
    assert set(torchdebug.__all__) == {*torchdebug._EXPORTS, *torchdebug._SUBMODULES, "__version__"}


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        torchdebug.nope  # noqa: B018


def test_lower_layers_never_import_higher_ones():
    for path in PACKAGE.rglob("*.py"):
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for imported, line in _imports(path):
            assert _layer(imported) <= _layer(part), f"{path.relative_to(PACKAGE)}:{line} imports torchdebug.{imported}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lazy_exports(init: Path) -> dict[str, str]:
    """``name -> module`` of a package that loads its names lazily (its ``_EXPORTS`` literal)."""
    for node in ast.parse(init.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets) and isinstance(node.value, ast.Dict):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values) if isinstance(k, ast.Constant)}
    return {}


_LAZY = {_module_name(init): _lazy_exports(init) for init in PACKAGE.rglob("__init__.py")}
"""What each lazily exporting package's names load: importing one loads its module, not the package's others."""


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The torchdebug modules ``path`` imports outside function bodies (at module level and under
    ``TYPE_CHECKING``): a name imported from a package counts as its module when it is one, and as
    the module it loads when the package exports it lazily."""
    name, found = _module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue  # a deferred import inside a function is how a module breaks a load-time circle
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, *([child.module] if child.module else [])])
                for alias in child.names:
                    dotted = f"{base}.{alias.name}"
                    found.add(dotted if dotted in modules else _LAZY.get(base, {}).get(alias.name, base))
            elif isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return (found & modules) - {name}


def test_no_module_imports_itself_through_others():
    """No import circle among the package's modules (type-only imports count: a circle is a design
    knot whichever import closes it)."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _imported_modules(path, set(paths)) for name, path in paths.items()}
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    circles = []

    def walk(name: str, trail: list[str]) -> None:
        state[name] = 1
        for imported in sorted(graph[name]):
            if state.get(imported) == 1:
                circles.append(" -> ".join([*trail[trail.index(imported) :], imported]))
            elif imported not in state:
                walk(imported, [*trail, imported])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert circles == []


API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
_PACKAGES = {_module_name(init) for init in PACKAGE.rglob("__init__.py")}


def _private_to(dotted: str) -> str | None:
    """The package a dotted name is private to: the one holding its first part with a leading
    underscore (``torchdebug.store._reader.load``: ``torchdebug.store``); ``None`` when it is public."""
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            holder = parts[:index]
            while ".".join(holder) not in _PACKAGES:  # a private name in a module: the module's package
                holder.pop()
            return ".".join(holder)
    return None


def _public_packages() -> list[str]:
    return sorted(package for package in _PACKAGES if _private_to(package) is None)


def _public_names(package: str) -> set[str]:
    """What a package offers: its ``__all__`` and its modules and subpackages without a leading underscore."""
    import importlib

    folder = PACKAGE.parent.joinpath(*package.split("."))
    modules = {path.stem for path in folder.glob("*.py")} | {path.parent.name for path in folder.glob("*/__init__.py")}
    declared = getattr(importlib.import_module(package), "__all__", None)
    assert declared is not None, f"{package} declares no __all__ (its public names)"
    return (set(declared) - {"__version__"}) | {name for name in modules if not name.startswith("_")}


def _documented() -> dict[str, set[str]]:
    """``package -> names`` from docs/api.md: a ``## `torchdebug.x``` heading per package, then one
    ``- `name` — what it is for`` line per public name."""
    documented: dict[str, set[str]] = {}
    names: set[str] | None = None
    for line in API.read_text().splitlines():
        if heading := re.match(r"^## `(torchdebug[\w.]*)`", line):
            names = documented.setdefault(heading.group(1), set())
        elif (item := re.match(r"^- `(\w+)` — \S", line)) and names is not None:
            assert item.group(1) not in names, f"{item.group(1)} is listed twice under one package in docs/api.md"
            names.add(item.group(1))
    return documented


def test_docs_api_lists_exactly_the_public_names_of_every_package():
    documented = _documented()
    assert sorted(documented) == _public_packages(), "docs/api.md has one section per public package"
    differing = {
        package: {"undocumented": sorted(public - listed), "not public": sorted(listed - public)}
        for package in _public_packages()
        if (public := _public_names(package)) != (listed := documented[package])
    }
    assert differing == {}


def _reaches(path: Path) -> list[tuple[str, str]]:
    """``(imported name, why)`` for each import of ``path`` that reaches into another package: a
    private module or name (a leading underscore) held by a package ``path`` is not inside, or a
    name a package does not offer (:func:`_public_names`)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - (node.level - 1)], *filter(None, [node.module])])
            imported = [f"{base}.{alias.name}" for alias in node.names] if base.startswith("torchdebug") else []
        elif isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names if alias.name.startswith("torchdebug")]
        else:
            continue
        for dotted in imported:
            holder = _private_to(dotted)
            if holder is not None and not (package == holder or package.startswith(f"{holder}.")):
                found.append((dotted, f"private to {holder}"))
                continue
            owner, _, offered = dotted.rpartition(".")
            inside = package == owner or package.startswith(f"{owner}.")
            if owner in _PACKAGES and _private_to(owner) is None and not inside and offered not in _public_names(owner):
                found.append((dotted, f"not among {owner}'s public names"))
    return found


def test_no_import_reaches_into_another_package():
    """A module or name with a leading underscore is private to its package (and the packages inside
    it); another package imports only what the owner offers, its ``__all__`` and public modules."""
    reaching = {(str(path.relative_to(PACKAGE)), dotted): why for path in PACKAGE.rglob("*.py") for dotted, why in _reaches(path)}
    assert reaching == {}


_PRIVATE_TORCH_MODULE = re.compile(r"^(torch\._|torch\.utils\._|torch\.nn\.modules\.module$|functorch)")
_PRIVATE_TORCH_ATTRIBUTES = {"_schema", "_version", "_sequence_nr", "_orig_mod", "_has_any_global_hook"}


def _private_torch_uses(path: Path) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and _PRIVATE_TORCH_MODULE.match(node.module):
            uses.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            uses += [f"import {a.name}" for a in node.names if _PRIVATE_TORCH_MODULE.match(a.name)]
        elif isinstance(node, ast.Attribute):
            dunder = node.attr.startswith("__")
            on_torch = isinstance(node.value, ast.Name) and node.value.id == "torch"
            if (on_torch and node.attr.startswith("_") and not dunder) or node.attr in _PRIVATE_TORCH_ATTRIBUTES:
                uses.append(f"line {node.lineno}: .{node.attr}")
    return uses


def test_private_torch_apis_are_used_only_in_the_torch_seam():
    offenders = {
        str(path.relative_to(PACKAGE)): uses
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] != "_torch" and (uses := _private_torch_uses(path))
    }
    assert not offenders, f"private torch API outside torchdebug/_torch: {offenders}"


_COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "functorch", "triton")


@pytest.mark.parametrize(
    "code",
    [
        "import torchdebug.scope",
        "import torchdebug; torchdebug.Debugger",
        "from torchdebug.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
    ],
    ids=["scope", "debugger", "cli-help"],
)
def test_cheap_entry_points_load_neither_dynamo_nor_inductor(code):
    loaded = f"{{'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith({_COMPILER_MODULES!r})}}"
    check = f"{code}\nimport sys\nprint(sorted({loaded}))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("name", ["compare", "diagnose"])
def test_packages_named_like_their_function_stay_callable_after_a_submodule_import(name):
    code = (
        f"import importlib, torchdebug\nimportlib.import_module('torchdebug.{name}._config')\n"
        f"print(callable(torchdebug.{name}), torchdebug.{name}.__doc__ is not None)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["True", "True"], result.stderr


_COMMANDS = ["show", "check", "convert", "config", "compare", "report", "diagnose"]


def test_the_help_of_every_subcommand_imports_no_torch_and_no_other_subcommand():
    """``torchdebug --help`` and ``torchdebug COMMAND --help`` build parsers only: torch (2 s to
    import) stays out, and so do the modules of the other subcommands."""
    code = (
        "import sys\nfrom torchdebug.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "heavy = ('torch', 'numpy', 'safetensors', 'jinja2')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy}), "
        "sorted(m for m in sys.modules if m.startswith('torchdebug.cli.') and m != 'torchdebug.cli.arguments'))"
    )
    for argv in [["--help"], *([command, "--help"] for command in _COMMANDS)]:
        result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "usage: torchdebug" in result.stdout
        expected = [] if len(argv) == 1 else [f"torchdebug.cli.{argv[0]}"]
        assert result.stdout.strip().splitlines()[-1] == f"[] {expected}", argv


def test_the_root_help_lists_every_subcommand_module():
    from torchdebug.cli import COMMANDS

    modules = {path.stem for path in (PACKAGE / "cli").glob("*.py")} - {"__init__", "arguments", "tensor_files"}
    assert list(COMMANDS) == _COMMANDS and set(COMMANDS) == modules


def test_every_file_the_package_reads_at_run_time_is_in_its_package_data():
    """A wheel holds the package's modules and the files ``[tool.setuptools.package-data]`` names:
    the native sources built on first use, the report's templates. One left out works in a checkout
    (an editable install reads the tree) and is missing from an installed wheel, where the native
    path then falls back to the dispatch mode (the C++ sources were missing so)."""
    import fnmatch

    pyproject = (PACKAGE.parents[1] / "pyproject.toml").read_text()
    listed = re.search(r"^\[tool\.setuptools\.package-data\]\ntorchdebug = (\[.*\])$", pyproject, re.MULTILINE)
    assert listed is not None, "pyproject.toml names the package's data files on one line"
    patterns = ast.literal_eval(listed.group(1))
    files = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*") if path.is_file()]
    data = [name for name in files if not name.endswith((".py", ".pyc")) and "__pycache__" not in name]
    assert "native/observer.cpp" in data and "native/stats.c" in data
    assert [name for name in data if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)] == []
