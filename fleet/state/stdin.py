"""A job's forwarded stdin in Redis (``spec.stdin``): what ``fleet run`` reads, on its way to the job.

One stream per job, ``d`` entries (bytes) and one ``eof`` entry (input ended), written through the
API (``POST /v1/jobs/{id}/stdin``) from the job's submit on, queued or running, and read by the agent
of the node that runs it, which writes them into the attempt's stdin and deletes each entry once
written. So an attempt reads what no attempt before it was given: a requeued job is not given its
input again (as ``srun``), it goes on from where the last attempt stopped, and sees EOF at once when
the input ended before. A counter beside the stream holds the bytes sent (``-1`` once it ended):
a job is sent at most ``MAX_BYTES``. Both expire ``TTL_S`` after the last write or read; the
agent deletes them once the job is final, and retention with the job's record (a job cancelled
while queued never reached an agent).
"""

from __future__ import annotations

from typing import Any

from fleet.errors import FleetError, SpecError
from fleet.keys import Keys

#: the most bytes one call may send (the CLI sends at most 64 KiB at a time)
MAX_CHUNK = 256 << 10
#: the most bytes a job may be sent in all
MAX_BYTES = 16 << 20
#: input nobody reads or writes expires this long after its last use (a job may wait long in the queue)
TTL_S = 7 * 86400

Entry = tuple[bytes, dict[bytes, bytes]]

_PUT = """
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
if used < 0 then return -1 end
local ttl = tonumber(ARGV[4])
if ARGV[1] == 'eof' then
  redis.call('XADD', KEYS[1], '*', 'eof', '1')
  redis.call('SET', KEYS[2], -1, 'EX', ttl)
  redis.call('EXPIRE', KEYS[1], ttl)
  return 0
end
local n = string.len(ARGV[2])
if used + n > tonumber(ARGV[3]) then return -2 end
redis.call('XADD', KEYS[1], '*', 'd', ARGV[2])
redis.call('SET', KEYS[2], used + n, 'EX', ttl)
redis.call('EXPIRE', KEYS[1], ttl)
return used + n
"""


class StdinStreams:
    """Jobs' forwarded input, on a client that returns bytes (input is not text)."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis, self.keys = redis, keys
        self._put = redis.register_script(_PUT)

    def put(self, job_id: str, data: bytes, eof: bool = False) -> int:
        """Append ``data`` (then, with ``eof``, the end of input); the bytes sent so far."""
        if len(data) > MAX_CHUNK:
            raise SpecError(f"stdin: {len(data)} bytes in one call, more than {MAX_CHUNK}; send it in parts")
        keys = [self.keys.stdin(job_id), self.keys.stdin(job_id, "bytes")]
        used = 0
        if data:
            used = int(self._put(keys=keys, args=["d", data, MAX_BYTES, TTL_S]))
        if used >= 0 and eof:
            used = int(self._put(keys=keys, args=["eof", b"", MAX_BYTES, TTL_S])) or used
        if used == -1:
            raise FleetError(f"stdin: the input of job {job_id} has ended already; nothing more is sent")
        if used == -2:
            raise SpecError(
                f"stdin: job {job_id} may be sent {MAX_BYTES >> 20} MiB of input at most; ship larger "
                "inputs as files (--workdir, a mount)"
            )
        return used

    def read(self, job_id: str, after: bytes, block_ms: int) -> list[Entry]:
        """The entries past ``after`` (``b"0"``: all those not given to an attempt yet), waiting up to
        ``block_ms`` for one."""
        got = self.redis.xread({self.keys.stdin(job_id): after}, count=64, block=block_ms)
        return list(got[0][1]) if got else []

    def given(self, job_id: str, entry_id: bytes) -> None:
        """The entry is in the job's stdin: the next attempt does not get it again."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xdel(self.keys.stdin(job_id), entry_id)
        pipe.expire(self.keys.stdin(job_id), TTL_S)
        pipe.execute()

    def drop(self, job_id: str) -> None:
        self.redis.delete(self.keys.stdin(job_id), self.keys.stdin(job_id, "bytes"))
