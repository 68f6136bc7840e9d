"""Optional libraries stay optional: importing torchdebug loads none, and a missing one is named."""

import subprocess
import sys

import pytest

from torchdebug.extras import import_extra

_OPTIONAL = ("lightning", "pytorch_lightning", "transformers", "accelerate", "pandas")  # pyarrow is required (the record store)


def test_import_torchdebug_and_its_public_names_import_no_optional_library():
    code = (
        "import sys, torchdebug\n"
        "for name in torchdebug.__all__: getattr(torchdebug, name)\n"
        f"print(sorted(m for m in {_OPTIONAL!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_missing_extra_is_named_in_one_line():
    with pytest.raises(ImportError, match=r"^to_pandas needs no_such_pkg: pip install 'torchdebug\[pandas\]' \(") as error:
        import_extra("no_such_pkg.sub", "pandas", "to_pandas")
    assert "\n" not in str(error.value)
