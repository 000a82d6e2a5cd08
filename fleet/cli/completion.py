"""``fleet completion bash|zsh|fish``: the shell's completion script for fleet."""

from __future__ import annotations

import click

from fleet.cli.common import CONTEXT

SHELLS = ("bash", "zsh", "fish")


@click.command(context_settings=CONTEXT, short_help="print the shell completion script (bash, zsh, fish)")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    """Print SHELL's completion script for fleet: commands, options and their choices complete on
    Tab. Load it in your shell's startup file:

    \b
      bash (~/.bashrc):                 eval "$(fleet completion bash)"
      zsh (~/.zshrc):                   eval "$(fleet completion zsh)"
      fish (~/.config/fish/config.fish): fleet completion fish | source
    """
    from click.shell_completion import get_completion_class

    from fleet.cli.main import COMPLETE_VAR, cli

    complete = get_completion_class(shell)
    assert complete is not None  # every one of SHELLS is click's
    click.echo(complete(cli, {}, "fleet", COMPLETE_VAR).source())
    return 0
