"""``python -m fleet.agent.runtime.shim DIR CMD...``: run CMD, then write its exit status to DIR/exit.

The process runtime starts every attempt under this shim, in a session of its own, so that an
agent restarted later can still learn how an attempt it did not start ended (it is not the
parent then). SIGTERM reaches the whole process group; the shim survives it to record the code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    folder, command = Path(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, lambda *_: None)
    with open(folder / "output.log", "ab", buffering=0) as out:
        try:
            child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            out.write(f"fleet: cannot run {command[0]!r}: {exc.strerror}\n".encode())
            code = 127
        else:
            returncode = child.wait()
            code = 128 - returncode if returncode < 0 else returncode
    tmp = folder / "exit.tmp"
    tmp.write_text(json.dumps({"code": code, "at": time.time()}))
    os.replace(tmp, folder / "exit")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
