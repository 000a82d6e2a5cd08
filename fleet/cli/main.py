"""``fleet``: submit and follow jobs, inspect nodes, run the services.

Exit codes: 0 ok (``wait``: SUCCEEDED); 1 job FAILED or other error; 2 bad input (spec, config,
usage); 3 no such job or node (a job deleted by retention: the message says it expired, and when);
4 ``wait`` timed out; 5 the API or Redis unreachable (or Redis full: maxmemory); 6 job CANCELLED;
7 the job's or node's record cannot be read (quarantined: the message says why); 8 no token, or
the token's role or tenant does not allow it (the message says what is missing).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fleet import __version__
from fleet.errors import FleetError


class _Parser(argparse.ArgumentParser):
    """No guessing: ``--prio 5`` is an error, not ``--priority 5`` (a typo must not change a job)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from fleet.cli import access, commands, elastic, services, sim, tenants

    parser = _Parser(
        prog="fleet",
        description="A serverless-style job queue for your own GPU fleet.",
        epilog="Exit codes: 0 ok, 1 job failed/error, 2 bad input, 3 not found (or expired), 4 timeout, "
        "5 API or Redis unreachable (or Redis full), 6 job cancelled, 7 record unreadable (quarantined), "
        "8 not allowed (no token, or its role or tenant). Start here: `fleet up`.",
    )
    parser.add_argument("--version", action="version", version=f"fleet {__version__}")
    parser.add_argument("--config", help="fleet.toml (default: $FLEET_CONFIG)")
    parser.add_argument("--api-url", help="the fleet API (default: $FLEET_API_URL, else `fleet login`'s)")
    parser.add_argument(
        "--redis-url", help="services and --direct only: the fleet's Redis (default: $FLEET_REDIS_URL)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    commands.register(sub)
    elastic.register(sub, commands.output_option)
    access.register(sub, commands.output_option)
    tenants.register(sub, commands.output_option)
    services.register(sub)
    sim.register(sub, commands.output_option)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # importing the commands (redis, pydantic, fleet) allocates a few hundred thousand objects and
    # none of them is garbage: collecting meanwhile costs ~15 ms of a command's ~250 for nothing
    gc.disable()
    try:
        args = build_parser().parse_args(argv)
    finally:
        gc.enable()
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()  # inside the try: a reader gone (`| head`) shows here, not at exit
        return code
    except FleetError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # the reader went away (`fleet jobs | head`): what it wanted it got; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


def run() -> int:
    """The ``fleet`` program: :func:`main`, then an exit that skips the interpreter's last garbage
    collection over every object the command left (~50 ms: a fifth of a short command's time)."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(run())
