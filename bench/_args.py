"""Argument types the benches share: a bad value stops the bench with one line naming the form it wants."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A positive integer."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def positive_ints(text: str) -> list[int]:
    """Positive integers, comma-separated."""
    return [positive_int(part) for part in text.split(",")]


def int_pairs(text: str) -> list[tuple[int, int]]:
    """``A:B`` pairs of positive integers, comma-separated."""
    pairs = []
    for part in text.split(","):
        first, colon, second = part.partition(":")
        if not colon:
            raise argparse.ArgumentTypeError(f"{part!r} is not A:B, two positive integers")
        pairs.append((positive_int(first), positive_int(second)))
    return pairs


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0
