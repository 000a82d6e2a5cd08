"""``fleet shell``: a shell, or one command, inside a running job's environment, on its node."""

from __future__ import annotations

import sys

import click

from fleet.cli.common import CONTEXT, Globals, complete_jobs, pass_globals
from fleet.cli.submit import CommandAfterDashes
from fleet.errors import FleetError
from fleet.models import JobState


@click.command(
    cls=CommandAfterDashes,
    context_settings=CONTEXT,
    short_help="a shell (or -- CMD) inside a running job, on the node that runs it (srun --pty)",
    epilog="Examples: sudo fleet shell JOB; sudo fleet shell JOB -- nvidia-smi. Runs on the job's node "
    "only: elsewhere it names the node to ssh to. Docker runtime: docker exec into the job's "
    "container; process runtime: the job's uid, working directory, environment and cgroup (what "
    "you start counts against the job's limits and ends with it).",
)
@click.argument("job", metavar="JOB [-- COMMAND [ARGS]...]", shell_complete=complete_jobs)
@pass_globals
@click.pass_context
def shell(ctx: click.Context, globals_: Globals, /, job: str) -> int:
    """A shell, or the command after `--`, inside the running job JOB: as the job's user, in its
    working directory, with its environment, as `srun --pty` or `det shell` give.

    Run it on the node that runs the job, as root (or the agent's user), with the agent's
    configuration (--config, FLEET_CONFIG); the API decides whether your token may see the job."""
    from fleet.agent.enter import enter, entry
    from fleet.config import load_settings

    settings = load_settings(globals_.config).agent
    found = globals_.client().get(job)  # a job this token may not see is no job (404)
    if found.state != JobState.RUNNING:
        raise FleetError(
            f"job {found.id} is {found.state.value}: fleet shell enters a RUNNING job "
            f"(`fleet wait` or `fleet show {found.id}` say where it stands)"
        )
    here = settings.node_name
    if found.rank_on(here) is None:
        nodes = found.nodes_held
        raise FleetError(
            f"job {found.id} runs on {', '.join(nodes)}, not on this node ({here}): "
            f"ssh {nodes[0]} and run fleet shell {found.id} there"
        )
    enter(entry(settings, found.id, found.attempt, ctx.meta.get("fleet.command", []), sys.stdin.isatty()))
