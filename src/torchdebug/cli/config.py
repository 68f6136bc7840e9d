"""``torchdebug config schema|check FILE``: the dump configuration's JSON schema, or validate a file."""

from __future__ import annotations

import argparse


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser(
        "schema", help="print the JSON schema of dump config files", formatter_class=parser.formatter_class
    ).set_defaults(func=_schema)
    check = actions.add_parser("check", help="validate a JSON or YAML config file", formatter_class=parser.formatter_class)
    check.add_argument("file")
    check.set_defaults(func=_check)


def _schema(args: argparse.Namespace) -> int:
    import json  # here, not at the top: `--help` needs the parser only

    from torchdebug.config import DebuggerConfig

    print(json.dumps(DebuggerConfig.json_schema(), indent=2, default=str))
    return 0


def _check(args: argparse.Namespace) -> int:
    import json  # here, not at the top: `--help` needs the parser only

    from torchdebug.config import DebuggerConfig

    config = DebuggerConfig.from_file(args.file)
    print(json.dumps(config.to_dict(), indent=2))
    return 0
