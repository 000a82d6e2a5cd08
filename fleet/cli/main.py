"""``fleet``: submit and follow jobs, inspect nodes, run the services.

Exit codes: 0 ok (``wait``: SUCCEEDED); 1 job FAILED or other error; 2 bad input (spec, config,
usage); 3 no such job or node (a job deleted by retention: the message says it expired, and when);
4 ``wait`` timed out; 5 the API or Redis unreachable (or Redis full: maxmemory); 6 job CANCELLED;
7 the job's or node's record cannot be read (quarantined: the message says why); 8 no token, or
the token's role or tenant does not allow it (the message says what is missing); 130 Ctrl-C (a job
waited for goes on, except under ``fleet run``, which cancels it). ``fleet run`` exits with its
job's own exit code once the job ran.

Built on click. Each group of commands is a module of its own (:data:`COMMANDS` names them),
imported only when one of its commands runs (or for ``--help`` and completion), so a command
pays for its own imports alone. A new group: a module with click commands, and its lines here.
"""

from __future__ import annotations

import difflib
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from fleet import __version__
from fleet.cli.common import CONTEXT, Globals
from fleet.errors import ConfigError, FleetError

#: section -> command -> "module:attribute" of its click command, in the order ``--help`` lists them
COMMANDS: dict[str, dict[str, str]] = {
    "Jobs": {
        "submit": "fleet.cli.submit:submit",
        "run": "fleet.cli.run:run",
        "jobs": "fleet.cli.jobs:jobs",
        "show": "fleet.cli.jobs:show",
        "logs": "fleet.cli.jobs:logs",
        "wait": "fleet.cli.jobs:wait",
        "result": "fleet.cli.results:result",
        "cancel": "fleet.cli.control:cancel",
        "hold": "fleet.cli.control:hold",
        "release": "fleet.cli.control:release",
        "update": "fleet.cli.control:update",
        "requeue": "fleet.cli.control:requeue",
        "shell": "fleet.cli.shell:shell",
        "download": "fleet.cli.download:download",
        "top": "fleet.cli.top:top",
        "resize": "fleet.cli.elastic:resize",
        "history": "fleet.cli.history:history",
    },
    "Nodes": {
        "nodes": "fleet.cli.nodes:nodes",
        "cordon": "fleet.cli.nodes:cordon",
        "uncordon": "fleet.cli.nodes:uncordon",
        "drain": "fleet.cli.nodes:drain",
    },
    "Access and tenants": {
        "login": "fleet.cli.access:login",
        "logout": "fleet.cli.access:logout",
        "whoami": "fleet.cli.access:whoami",
        "token": "fleet.cli.access:token",
        "tenants": "fleet.cli.tenants:tenants",
        "tenant": "fleet.cli.tenants:tenant",
    },
    "Services": {
        "up": "fleet.cli.services:up",
        "controller": "fleet.cli.services:controller",
        "agent": "fleet.cli.services:agent",
        "api": "fleet.cli.services:api",
        "install": "fleet.cli.services:install",
        "doctor": "fleet.cli.doctor:doctor",
        "uninstall": "fleet.cli.services:uninstall",
        "version": "fleet.cli.version:version",
    },
    "Simulation": {"sim": "fleet.cli.sim:sim"},
    "Shell": {"completion": "fleet.cli.completion:completion"},
}
_WHERE = {name: where for section in COMMANDS.values() for name, where in section.items()}
#: fleet's own options, given before the command
GLOBAL_OPTIONS = ("--config", "--api-url", "--redis-url")
#: the variable click's completion scripts set (``fleet completion bash`` prints one)
COMPLETE_VAR = "_FLEET_COMPLETE"


class FleetGroup(click.Group):
    """The root: commands imported on first use, listed by section, no guessing at names (a
    mistyped one is refused, the closest named)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_WHERE)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = _WHERE.get(cmd_name)
        if where is None:
            return None
        module, attr = where.split(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name not in _WHERE and not name.startswith("-") and not ctx.resilient_parsing:
            # a mistyped command: name the closest one (click's own guess sees no lazy command)
            close = difflib.get_close_matches(name, _WHERE, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise click.UsageError(f"no such command {name!r}{hint}", ctx)
        found = super().resolve_command(ctx, args)
        rest = args[1 : args.index("--")] if "--" in args else args[1:]  # a job's own --help is its own
        if not ctx.resilient_parsing and not set(rest) & set(ctx.help_option_names):  # help: always
            config_exists(ctx.params.get("config"))
        # the imports are done: what the command allocates from here on may be garbage (see main)
        gc.enable()
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for section, names in COMMANDS.items():
            rows = []
            for name in names:
                command = self.get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(limit=200)))
            with formatter.section(section):
                formatter.write_dl(rows)


@click.group(
    cls=FleetGroup,
    context_settings=CONTEXT,
    epilog="Exit codes: 0 ok, 1 job failed/error, 2 bad input, 3 not found (or expired), 4 timeout, "
    "5 API or Redis unreachable (or Redis full), 6 job cancelled, 7 record unreadable (quarantined), "
    "8 not allowed (no token, or its role or tenant), 130 Ctrl-C; fleet run: the job's own. "
    "Start here: `fleet up`. Shell completion: "
    "`fleet completion --help`.",
)
@click.version_option(__version__, "--version", prog_name="fleet", message="%(prog)s %(version)s")
@click.option("--config", metavar="FILE", help="fleet.toml (default: $FLEET_CONFIG)")
@click.option(
    "--api-url", metavar="URL", help="the fleet API (default: $FLEET_API_URL, else `fleet login`'s)"
)
@click.option(
    "--redis-url",
    metavar="URL",
    help="services and --direct only: the fleet's Redis (default: $FLEET_REDIS_URL)",
)
@click.pass_context
def cli(ctx: click.Context, config: str | None, api_url: str | None, redis_url: str | None) -> None:
    """A serverless-style job queue for your own GPU fleet."""
    ctx.obj = Globals(config, api_url, redis_url)


def config_exists(config: str | None) -> None:
    """A config file named (``--config``, else ``$FLEET_CONFIG``) that is not there is an error, for
    every command: a typo in its name would otherwise leave the defaults in force, unnoticed."""
    named, path, fix = "--config", config, "give the path of a fleet.toml"
    if not config:
        named, path, fix = "FLEET_CONFIG", os.environ.get("FLEET_CONFIG"), "unset it or name a fleet.toml"
    if path and not os.path.isfile(path):
        raise ConfigError(f"{named} {path}: no such file ({fix})")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``fleet`` command; its exit code. Every error a user can cause is one ``fleet: ...``
    line on stderr naming the fix, with the documented exit code: never a traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    if COMPLETE_VAR in os.environ:  # the shell asks for completions (see `fleet completion`)
        from click.shell_completion import shell_complete

        return shell_complete(cli, {}, "fleet", COMPLETE_VAR, os.environ[COMPLETE_VAR])
    # importing a command's modules (pydantic, fleet) allocates a few hundred thousand objects and
    # none of them is garbage: collecting meanwhile costs ~15 ms of a command's ~150 for nothing
    # (FleetGroup.resolve_command enables it again once the command is imported)
    gc.disable()
    try:
        with cli.make_context("fleet", args) as ctx:
            code: Any = cli.invoke(ctx)
        sys.stdout.flush()  # inside the try: a reader gone (`| head`) shows here, not at exit
        return int(code or 0)
    except click.exceptions.Exit as done:  # --help, --version
        return done.exit_code
    except click.UsageError as exc:
        print(usage_line(exc), file=sys.stderr)
        return 2
    except FleetError as exc:
        print(f"fleet: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # the reader went away (`fleet jobs | head`): what it wanted it got; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (KeyboardInterrupt, click.Abort):
        return 130
    finally:
        gc.enable()


def one_line(message: str) -> str:
    """``invalid job spec:\n  gpus: ...`` with one bad field as one line (several: a line each)."""
    head, *details = message.split("\n")
    return f"{head} {details[0].strip()}" if len(details) == 1 and details[0].startswith("  ") else message


def usage_line(exc: click.UsageError) -> str:
    """click's usage error as one ``fleet:`` line: what is wrong, then where the command's help is."""
    from click.exceptions import BadParameter, MissingParameter, NoArgsIsHelpError, NoSuchOption

    if isinstance(exc, NoArgsIsHelpError):  # a bare `fleet`: the help is the most useful answer
        return exc.format_message().rstrip("\n")
    message = exc.format_message()
    if isinstance(exc, NoSuchOption) and exc.option_name in GLOBAL_OPTIONS and exc.ctx is not None:
        where = exc.ctx.command_path.removeprefix("fleet ")
        name = exc.option_name
        return f"fleet: {name} is fleet's own option: give it before the command, fleet {name} ... {where}"
    if isinstance(exc, NoSuchOption):
        close = f" (did you mean {exc.possibilities[0]}?)" if exc.possibilities else ""  # the closest
        message = f"no such option: {exc.option_name}{close}"
    elif isinstance(exc, BadParameter) and not isinstance(exc, MissingParameter) and exc.param is not None:
        param = exc.param
        name = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
        message = f"{name}: {exc.message.rstrip('.')}"
    path = exc.ctx.command_path if exc.ctx is not None else "fleet"
    if message[1:2].islower():  # click's "Missing argument", not an argument's NAME
        message = message[:1].lower() + message[1:]
    return f"fleet: {message.rstrip('.')} (see `{path} --help`)"


def run() -> int:
    """The ``fleet`` program: :func:`main`, then an exit that skips the interpreter's last garbage
    collection over every object the command left (~50 ms: a fifth of a short command's time)."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(run())
