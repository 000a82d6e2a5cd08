"""``fleet doctor``: is this node ready to run fleet's agent? Each check is one :class:`Check`.

The checks read the settings the agent reads (``fleet.toml``, ``FLEET_*``; with no Redis user or
password given there, the ones ``fleet install agent`` handed the agent's unit) and use the agent's
own parts: the NVML inventory, the runtime choice, the Redis connection. Each says what it found
and, when it warns or fails, what to do. Nothing here changes what the agent runs; the doctor
writes only its marker (``<checkpoint_root>/.fleet-doctor/<node>`` and ``<prefix>:doctor:markers``),
by which nodes that share ``checkpoint_root`` recognise each other.

:mod:`.run` runs them all in order (:func:`.run.diagnose`); :mod:`.report` holds :class:`.report.Check`
and the exit code; the checks, by area: :mod:`.gpus` (NVML, each GPU), :mod:`.runtime` (the runtime
choice, Docker, a ``--gpus`` container), :mod:`.host` (cgroups, the network guard, the ports and
address of multi-node jobs), :mod:`.connection` (Redis with the agent's user, the clock against
Redis'), :mod:`.storage` (``checkpoint_root`` and the markers that show it shared).
"""
