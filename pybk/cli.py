"""The ``pybk`` command."""

from __future__ import annotations

import argparse
import logging

from pybk import demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pybk", description="pybk: BookKeeper in Python")
    parser.add_argument("--log-level", default="WARNING", help="logging level")
    commands = parser.add_subparsers(dest="command", required=True)
    demo_cmd = commands.add_parser(
        "demo", help="an embedded WAL: appends, kill -9, restart, verify every record")
    demo_cmd.add_argument("--dir", help="data directory (default: a temporary one)")
    demo_cmd.add_argument("--seconds", type=float, default=3.0,
                          help="how long the writer appends before it is killed")
    demo_cmd.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        if args.child:
            demo.write_child(args.dir, args.seconds)
            return 0
        return demo.run_demo(args.dir, args.seconds)
    return 2
