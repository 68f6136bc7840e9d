"""``torchdebug config schema|check FILE``: the dump configuration's JSON schema, or validate a file."""

from __future__ import annotations

import argparse
import json

from torchdebug.config import DebuggerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="print the config schema or check a config file", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("schema", help="print the JSON schema of dump config files").set_defaults(func=_schema)
    check = actions.add_parser("check", help="validate a JSON or YAML config file")
    check.add_argument("file")
    check.set_defaults(func=_check)


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(DebuggerConfig.json_schema(), indent=2, default=str))
    return 0


def _check(args: argparse.Namespace) -> int:
    config = DebuggerConfig.from_file(args.file)
    print(json.dumps(config.to_dict(), indent=2))
    return 0
