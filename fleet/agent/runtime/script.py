"""The fake runtime's tiny shell: what a script writes, when, and how it ends, SIGTERM included.

:class:`~fleet.agent.runtime.fake.FakeRuntime`'s docstring says what it reads. A script is laid out
once, at its start, in seconds after it; SIGTERM (:func:`term`) changes how it ends.
"""

from __future__ import annotations

import math
import shlex
import signal
from dataclasses import dataclass, field


@dataclass
class Script:
    """What one shell does (the attempt's, or one it runs in the foreground), in seconds after its start."""

    #: (seconds, text, whether the line ended) of every line it writes itself
    output: list[tuple[float, str, bool]] = field(default_factory=list)
    #: when it ends by itself, and with what; None: it never does
    ends_after: float | None = None
    code: int = 0
    #: its SIGTERM trap: None the default (it ends, 143), [] ignored, else the action's statements
    on_term: list[list[str]] | None = None
    #: (from, to, the shell or None for a ``sleep``) of each foreground command: a trap waits for it
    foreground: list[tuple[float, float, Script | None]] = field(default_factory=list)
    #: when it ran its last command with ``exec`` (its trap gone with it)
    exec_at: float | None = None


def interpret(command: tuple[str, ...] | list[str]) -> Script:
    """Lay out what a command writes, when, and how it ends (see ``FakeRuntime``'s module)."""
    script = command[2] if len(command) == 3 and command[0].endswith("sh") and command[1] == "-c" else None
    return _lay_out(_statements(script) if script is not None else [list(command)])


def _statements(script: str) -> list[list[str]]:
    """A script's ``;``-separated statements, as words, quotes respected."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&")
    lexer.whitespace_split = True
    statements: list[list[str]] = [[]]
    for token in lexer:
        if token == ";":
            statements.append([])
        else:
            statements[-1].append(token)
    return [words for words in statements if words]


def _lay_out(statements: list[list[str]]) -> Script:
    run, at = Script(), 0.0
    for words in statements:
        if words[0] == "exec" and len(words) > 1:
            words, run.exec_at = words[1:], at
        program, args = words[0].rsplit("/", 1)[-1], words[1:]
        if args[-2:] == ["&", "wait"]:  # the trap runs at once, as the background sleep ends on it
            args = args[:-2]
        run.code = 0  # the status of its last command: what it exits with at its end
        if program in ("echo", "printf"):
            run.output.append((at, " ".join(args), program == "echo"))
        elif program in ("exit", "true", "false"):
            run.code = int(args[0]) if program == "exit" and args else int(program == "false")
            run.ends_after = at
            return run
        elif program == "trap" and args[-1:] == ["TERM"]:
            action = _statements(args[0]) if len(args) == 2 else []
            run.on_term = action if not action or action[-1][0] == "exit" else None
        elif program != ":" and (at := _foreground(run, at, program, args)) == math.inf:
            return run  # a program the fake cannot run, or one that never ends: until the test ends it
        if run.exec_at is not None:  # an exec'd command was the shell's last
            break
    run.ends_after = at
    return run


def _foreground(run: Script, at: float, program: str, args: list[str]) -> float:
    """Lay out a foreground ``sleep`` or ``sh -c``: when it ends (inf: never, or unknown)."""
    if program == "sleep" and len(args) == 1 and (seconds := _number(args[0])) is not None:
        run.foreground.append((at, at + seconds, None))
        return at + seconds
    if program.endswith("sh") and len(args) == 2 and args[0] == "-c":
        child = _lay_out(_statements(args[1]))
        end = at + child.ends_after if child.ends_after is not None else math.inf
        run.foreground.append((at, end, child))
        run.code = child.code
        return end
    return math.inf


def term(run: Script, into: float) -> None:
    """SIGTERM reaches the shell and its foreground command ``into`` seconds after its start: change
    how it ends (what a trap writes included). A shell ignoring it passes that on to what it runs."""
    if (run.ends_after is not None and into >= run.ends_after) or run.on_term == []:
        return
    done, code = into, 128 + signal.SIGTERM  # when its foreground command ends, and with what
    fg = next((i for i, (start, to, _) in enumerate(run.foreground) if start <= into < to), None)
    if fg is not None:
        start, _, child = run.foreground[fg]
        if child is not None:
            term(child, into - start)
            done = start + child.ends_after if child.ends_after is not None else math.inf
            code = child.code
        run.foreground[fg] = (start, done, child)
    if run.exec_at is not None and into >= run.exec_at:  # the shell is its foreground command now
        run.ends_after, run.code = (done, code) if done != math.inf else (None, run.code)
    elif run.on_term is None:
        run.ends_after, run.code = into, 128 + signal.SIGTERM
    elif done == math.inf:  # the trap waits for a foreground command that never ends
        run.ends_after = None
    else:
        _trap(run, done, code)


def _trap(run: Script, at: float, status: int) -> None:
    """Run the shell's trap action from ``at``, once its foreground command ended with ``status``."""
    run.output = [line for line in run.output if line[0] <= at]
    for words in run.on_term or []:
        if words[0] in ("echo", "printf"):
            run.output.append((at, " ".join(words[1:]), words[0] == "echo"))
        elif words[0] == "sleep" and len(words) == 2:
            at += _number(words[1]) or 0.0
        elif words[0] == "exit":
            run.ends_after, run.code = at, int(words[1]) if len(words) > 1 else status
            return


def written(run: Script, upto: float) -> list[tuple[float, str, bool]]:
    """The lines a shell and the shells it ran wrote by ``upto`` seconds after its start, in order."""
    if run.ends_after is not None:
        upto = min(upto, run.ends_after)
    lines = [line for line in run.output if line[0] <= upto]
    for start, _, child in run.foreground:
        if child is not None and start <= upto:
            lines.extend((start + at, text, whole) for at, text, whole in written(child, upto - start))
    return sorted(lines, key=lambda line: line[0])


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
