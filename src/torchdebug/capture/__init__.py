"""Capturing records: eager ops (dispatch mode), modules (hooks), filters and call stacks."""
