"""``fleet doctor``: check a node before (or after) its agent runs there."""

from __future__ import annotations

import json

import click

from fleet.cli.common import CONTEXT, Globals, pass_globals


@click.command(
    context_settings=CONTEXT,
    short_help="check this node for the agent: GPUs, Docker, Redis, clock, checkpoint storage, ports",
)
@click.option("--node-name", help="this node's name (default: agent.node_name, the hostname)")
@click.option(
    "--runtime", type=click.Choice(["auto", "docker", "process"]), help="as `fleet agent --runtime`"
)
@click.option("--gpus", type=click.Choice(["auto", "nvml", "simulated"]), help="as `fleet agent --gpus`")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="a line per check for people, json for scripts",
)
@pass_globals
def doctor(
    globals_: Globals, node_name: str | None, runtime: str | None, gpus: str | None, output: str
) -> int:
    """Check this node with the settings its agent reads (--config, FLEET_*, the credentials `fleet
    install agent` gave it): NVML and each GPU, the runtime (Docker, its NVIDIA runtime, a --gpus
    container), cgroup v2, Redis with the agent's user, the clock against Redis', checkpoint_root
    (writable, and the same storage as on the nodes that ran `fleet doctor` before), the ports and
    address of multi-node jobs. A line per check: ok, WARN, FAIL or skip, what was found, and what
    to do. Run it as the agent runs (root). Writes only its marker, checkpoint_root/.fleet-doctor/NODE.

    Exit code: 0 when no check failed (warnings do not fail), 1 when one did, 2 bad config."""
    from pydantic import ValidationError

    from fleet.config import load_settings
    from fleet.config_sections import AgentSettings
    from fleet.errors import ConfigError
    from fleet.ops.doctor.report import exit_code
    from fleet.ops.doctor.run import diagnose

    settings = load_settings(globals_.config, redis_url=globals_.redis_url)
    overrides = {"node_name": node_name, "runtime": runtime, "gpus": gpus}
    try:  # the node's name becomes a file name: checked as the config's is
        settings.agent = AgentSettings.model_validate(
            {**settings.agent.model_dump(), **{k: v for k, v in overrides.items() if v}}
        )
    except ValidationError as exc:
        raise ConfigError(f"--node-name {node_name!r}: {exc.errors()[0]['msg']}") from None
    checks = []
    for check in diagnose(settings, globals_.config):
        checks.append(check)
        if output == "table":
            click.echo(check.line())
    code = exit_code(checks)
    if output == "json":
        click.echo(json.dumps({"checks": [c.as_dict() for c in checks], "exit_code": code}, indent=2))
    else:
        counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail", "skip")}
        click.echo(
            f"{counts['ok']} ok, {counts['warn']} warnings, {counts['fail']} failed, {counts['skip']} skipped"
        )
    return code
