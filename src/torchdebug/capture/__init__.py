"""Capturing records: eager ops (dispatch mode), modules (hooks), filters and call stacks.

Its modules are its doors (docs/api.md): the package itself re-exports nothing.
"""

__all__: list[str] = []
