"""Every Redis key fleet uses, in one place.

State lives in the configured logical DB under ``<prefix>:``; the dramatiq bus lives in its own
logical DB (``bus_db``) so that dramatiq's maintenance, which scans the DB's key names (SCAN in
fleet's copy of its dispatch script, ``fleet.bus.broker.dispatch_script``), never scans job data.
Redis ACL users (config/users.acl) are granted ``~fleet ~fleet:*`` in every DB: dramatiq passes its
namespace, ``fleet``, as a key; key patterns are not per-DB.

| key                               | type   | holds                                                   |
|-----------------------------------|--------|---------------------------------------------------------|
| ``<p>:seq``                       | string | submission counter (FIFO order within a priority)       |
| ``<p>:jobs``                      | zset   | every job id, scored by submission seq                  |
| ``<p>:jobs:of:<tenant>``          | zset   | a tenant's job (and task) ids, scored by seq: its       |
|                                   |        | listing, without walking other tenants' jobs            |
| ``<p>:jobs:queued``               | zset   | ids of QUEUED jobs scored by rank: higher priority      |
|                                   |        | first, then seq (``lua/lib/ranked.lua``)                |
| ``<p>:queue:<tenant>``            | zset   | the same, one tenant's (positions in a tenant's queue)  |
| ``<p>:queue:@tenants``            | set    | tenants with QUEUED jobs                                |
| ``<p>:indexed``                   | string | set once the jobs of an older version are in the        |
|                                   |        | per-tenant indexes (``RankIndex.backfill``)             |
| ``<p>:jobs:state:<STATE>``        | set    | ids of jobs in STATE                                    |
| ``<p>:jobs:ended``                | zset   | ids of final (or quarantined) jobs, scored by end time  |
| ``<p>:jobs:changed``              | zset   | ids of jobs a user changed in the queue (hold, release, |
|                                   |        | update, requeue), scored by ``<p>:jobs:changed:version``|
|                                   |        | at the change: the leader reads those since its last    |
|                                   |        | look (``lua/lib/changed.lua``), newest 10,000 kept      |
| ``<p>:jobs:changed:version``      | string | counter of those changes                                |
| ``<p>:jobs:changed:trimmed``      | string | the newest version trimmed from the zset (a leader      |
|                                   |        | behind it reads its whole queue again)                  |
| ``<p>:job:<id>``                  | hash   | the job record (spec JSON, state, attempt, node, ...);  |
|                                   |        | an array task holds ``array`` and ``index``, not a spec |
| ``<p>:job:<id>:events``           | stream | transitions with their reasons (``fleet show``); absent |
|                                   |        | until the first one after submit (submit is implied by  |
|                                   |        | ``created_at``: a stream costs ~4.7 KB even when tiny)  |
| ``<p>:arrays``                    | zset   | every job array id, scored by its first task's seq      |
| ``<p>:array:<id>``                | hash   | array record: spec JSON (once for all tasks), indices   |
|                                   |        | in normal form, size, max_running, seq range, tasks     |
|                                   |        | ``left`` (deleted with its last task by retention)      |
| ``<p>:array:<id>:active``         | set    | ids of the array's tasks on nodes (SCHEDULED, STARTING, |
|                                   |        | RUNNING): what the scheduler counts against max_running |
| ``<p>:job:<id>:logs:<attempt>``   | stream | log lines of one attempt, capped                        |
| ``<p>:job:<id>:expired``          | string | tombstone of a deleted job (JSON: state, ended, deleted)|
| ``<p>:claims``                    | hash   | GPU UUID -> "<job id>:<attempt>" holding it             |
| ``<p>:nodes``                     | set    | every node name registered and not removed              |
| ``<p>:node:<name>``               | hash   | node record (state, inventory JSON, heartbeat, the      |
|                                   |        | agent's release and the heartbeat that wrote it)        |
| ``<p>:node:<name>:lease``         | string | agent id, with the node lease TTL; gone = node DOWN     |
| ``<p>:node:<name>:jobs``          | set    | ids of jobs placed on the node and not yet released     |
| ``<p>:node:<name>:alloc``         | hash   | job id -> "<cpus> <memory>" granted on the node          |
| ``<p>:leader``                    | string | "<controller id>:<token>", with the leader lease TTL    |
| ``<p>:leader:token``              | string | fencing token counter, bumped on every new leadership   |
| ``<p>:leader:version``            | string | the leading controller's release, with the lease's TTL  |
|                                   |        | (absent while a leader of 0.1.0, which set none, leads) |
| ``<p>:metrics:requeues``          | hash   | requeue kind -> count (Prometheus ``fleet_requeues``)   |
| ``<p>:metrics:preemptions``       | hash   | tenant -> jobs of it preempted (``fleet_preemptions``)  |
| ``<p>:tenants``                   | hash   | tenant name -> its policy (Tenant JSON); no record:     |
|                                   |        | the default policy                                      |
| ``<p>:job_uids``                  | hash   | tenant -> its offset in ``agent.job_uid_range`` (its    |
|                                   |        | jobs' uid and gid): given at its first launch, kept     |
|                                   |        | for good (``job_uid.lua``)                              |
| ``<p>:tenants:usage``             | hash   | tenant -> decayed GPU-seconds, and ``@at`` -> when the  |
|                                   |        | leader last folded the allocation in (fair share)       |
| ``<p>:tenants:status``            | hash   | tenant -> TenantStatus JSON the leader last published,  |
|                                   |        | and ``@at``; rewritten whole each time                  |
| ``<p>:quarantine:jobs``           | hash   | job id -> why its record cannot be read (set aside)     |
| ``<p>:quarantine:nodes``          | hash   | node name -> why its record cannot be read              |
| ``<p>:blob:<sha256>``             | string | a directory shipped with jobs (tar.gz), a scaling       |
|                                   |        | profile (JSON) or a function's call, expiring           |
|                                   |        | ``workdir_retention_s`` after its last upload, submit,  |
|                                   |        | or use by the leader; a call held by jobs never expires |
|                                   |        | and goes with the last of them                          |
| ``<p>:blob:<sha256>:jobs``        | set    | ids of the jobs and job arrays whose call it is, each   |
|                                   |        | added at its submit, removed as retention deletes it    |
| ``<p>:blobsize:<sha256>``         | string | "<packed> <bytes> <files>" of a shipped directory, kept |
|                                   |        | as long as its blob                                     |
| ``<p>:blobs:of:<tenant>``         | hash   | sha256 -> "<bytes> <expires ms>": the blobs a tenant    |
|                                   |        | uploaded, the only ones it may use, counted against its |
|                                   |        | ``blob_quota_bytes``; a submit naming one renews it     |
| ``<p>:outbox``                    | stream | jobs as they end (kind, id, state), capped at ~50,000:  |
|                                   |        | the feed of the leader's webhook sender                 |
| ``<p>:webhooks:cursor``           | string | the last outbox entry the sender turned into deliveries |
| ``<p>:webhooks:nodes``            | hash   | node -> the state the sender last announced (``@init``: |
|                                   |        | set once the first look was taken, announcing nothing); |
|                                   |        | deleted while no tenant's webhook hears nodes           |
| ``<p>:webhooks:pending``          | hash   | delivery id -> a delivery not yet done (JSON: URL,      |
|                                   |        | body, attempts, last error)                             |
| ``<p>:webhooks:due``              | zset   | delivery id -> when its next attempt is due             |
| ``<p>:webhooks:log``              | stream | each attempt's outcome (capped at ~1,000 entries)       |
| ``<p>:webhooks:secrets``          | hash   | tenant -> the secret its webhooks are signed with       |
| ``<p>:doctor:markers``            | hash   | node -> the shared-storage marker ``fleet doctor`` last |
|                                   |        | wrote there (JSON: node, at, nonce, root); expires a    |
|                                   |        | week after the last write, older entries are dropped    |
| ``<p>:doctor:clock:<node>``       | string | ``fleet doctor``'s probe of Redis' clock (when ``TIME`` |
|                                   |        | is not allowed): set for 60 s, read, deleted at once    |
| ``<p>:shell:<session>``           | string | a ``fleet shell`` session the API offered and no agent  |
|                                   |        | took yet (30 s); the agent deletes it as it takes it    |
| ``<p>:shell:<session>:in``        | stream | the session's input (bytes, EOF, resizes, close), and   |
| ``<p>:shell:<session>:out``       | stream | its output and exit code; both expire 10 min after the  |
|                                   |        | last entry and are deleted when the session ends        |
| ``<p>:acct:<day>``                | hash   | job id -> its accounting row (JSON: tenant, user, name, |
|                                   |        | state, GPUs, times, run/GPU/CPU-seconds over attempts), |
|                                   |        | for jobs that ended that day (day = end // 86400)       |
| ``<p>:acct:days``                 | zset   | the days with a ``<p>:acct:<day>`` hash, scored by day  |
| ``<p>:replicated``                | string | a counter every acknowledged write bumps before it      |
|                                   |        | ``WAIT``s for replicas (``fleet.state.replication``)    |
| ``<p>:redis:failovers``           | hash   | the sentinels' epoch of a failover -> what a service    |
|                                   |        | saw of it (Failover JSON); the newest 100               |
| ``<p>:tokens``                    | set    | ids of API tokens                                       |
| ``<p>:token:<id>``                | hash   | a token: sha256 of its secret, user, tenant, role,      |
|                                   |        | expiry (the key expires with it)                        |

The bus DB holds dramatiq's own keys under ``fleet:`` (documented in dramatiq's
``brokers/redis/dispatch.lua``): ``<queue>`` and ``<queue>.msgs`` (pending ids, id -> data),
``<queue>.XQ`` and ``<queue>.XQ.msgs`` (dead letters), ``__acks__.<broker id>.<queue>`` (fetched,
not yet acked) and ``__heartbeats__``. fleet changes them through dramatiq's dispatch script, except
that it trims a queue's dead letters to the newest ``bus_dead_letters_max`` and deletes every key of
a removed node's queue (``fleet.bus.broker``); ``fleet.bus.deadletters.dramatiq_keys`` reads two of them
to find the id of bytes it cannot decode.

Retention: every job key (``<p>:job:<id>`` and below) and a job's members of the sets above are
deleted ``job_retention_s`` after the job ended, leaving its tombstone for
``tombstone_retention_s``; a node's keys go ``node_retention_s`` after its last heartbeat once it
holds no job. ``<p>:seq``, ``<p>:leader:token``, ``<p>:replicated`` and ``<p>:metrics:requeues`` are
fixed-size and kept; so are ``<p>:redis:failovers`` (the newest 100), ``<p>:webhooks:cursor``,
``<p>:webhooks:nodes`` (one field per node) and ``<p>:outbox``, emptied of what the webhook sender
took from it.
Accounting rows outlive their jobs: a day's hash goes ``accounting_retention_s`` (400 days) after the
day ended (``fleet history`` reads them).
Tenants are the operator's records, kept until deleted; a tenant's usage entry goes once it has
decayed below one GPU-second, and its status entry once it has neither jobs nor a record. Job uids
are kept for good, a deleted tenant's too: a uid given to a second tenant would own the first's files.

In the bus DB fleet adds two lists, so that idle consumers block instead of polling (``fleet.bus.wake``):

| key                                   | type | holds                                              |
|---------------------------------------|------|----------------------------------------------------|
| ``fleet:__wake__.<queue>``            | list | at most one wake token, pushed after each enqueue; |
|                                       |      | expires after 60 s                                 |
| ``fleet:__stop__.<broker id>.<queue>``| list | a token that ends one process's consumer's BLPOP   |
|                                       |      | when its worker stops; expires after 60 s          |

Tokens are hints: a lost one costs a message at most ``bus_poll_ms``, a duplicated one an empty fetch.

And in the state DB, one stream per running ``fleet api`` (``fleet.state.watch``):

| key                                   | type   | holds                                            |
|---------------------------------------|--------|--------------------------------------------------|
| ``<p>:api:wake:<id>``                 | stream | at most one entry, added when a waiter watches a |
|                                       |        | new stream: it ends the process's blocking read; |
|                                       |        | deleted when the API stops, else expires in 1 h  |
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "fleet"

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    @property
    def queued(self) -> str:
        return f"{self.prefix}:jobs:queued"

    @property
    def indexed(self) -> str:
        return f"{self.prefix}:indexed"

    def jobs_of(self, tenant: str | None) -> str:
        """The listing of a tenant's jobs, or every job's (``tenant`` None)."""
        return self.jobs if tenant is None else f"{self.prefix}:jobs:of:{tenant}"

    def queued_in(self, tenant: str) -> str:
        """A tenant's queued jobs by rank (tenant names cannot hold '@', so none is ``@tenants``)."""
        return f"{self.prefix}:queue:{tenant}"

    @property
    def queued_tenants(self) -> str:
        return f"{self.prefix}:queue:@tenants"

    @property
    def state_prefix(self) -> str:
        return f"{self.prefix}:jobs:state:"

    def jobs_in(self, state: str) -> str:
        return f"{self.state_prefix}{state}"

    @property
    def ended(self) -> str:
        return f"{self.prefix}:jobs:ended"

    @property
    def changed(self) -> str:
        """Zset: job id -> the ``changed_version`` of its last change by a user in the queue (hold,
        release, update, requeue): what the leader's queue in memory reads again, message or not."""
        return f"{self.prefix}:jobs:changed"

    @property
    def changed_version(self) -> str:
        return f"{self.prefix}:jobs:changed:version"

    @property
    def changed_trimmed(self) -> str:
        return f"{self.prefix}:jobs:changed:trimmed"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def events(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:events"

    def shell(self, session: str, side: str = "") -> str:
        """A ``fleet shell`` session's offer (``side`` ""), or its ``in`` or ``out`` stream."""
        return f"{self.prefix}:shell:{session}" + (f":{side}" if side else "")

    def stdin(self, job_id: str, part: str = "") -> str:
        """A job's forwarded input (a stream), or how many bytes it was sent (``part`` "bytes")."""
        return f"{self.prefix}:job:{job_id}:stdin" + (f":{part}" if part else "")

    def logs(self, job_id: str, attempt: int, rank: int = 0) -> str:
        """An attempt's output; a multi-node job's other members (rank > 0) each have their own."""
        base = f"{self.prefix}:job:{job_id}:logs:{attempt}"
        return f"{base}:{rank}" if rank else base

    def wake(self, reader: str) -> str:
        """The stream that ends one API process's blocking read of the streams its waiters watch."""
        return f"{self.prefix}:api:wake:{reader}"

    def tombstone(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:expired"

    @property
    def arrays(self) -> str:
        return f"{self.prefix}:arrays"

    def array(self, array_id: str) -> str:
        return f"{self.prefix}:array:{array_id}"

    def array_active(self, array_id: str) -> str:
        return f"{self.prefix}:array:{array_id}:active"

    @property
    def claims(self) -> str:
        return f"{self.prefix}:claims"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def node(self, name: str) -> str:
        return f"{self.prefix}:node:{name}"

    def node_lease(self, name: str) -> str:
        return f"{self.prefix}:node:{name}:lease"

    def node_jobs(self, name: str) -> str:
        return f"{self.prefix}:node:{name}:jobs"

    def node_alloc(self, name: str) -> str:
        return f"{self.prefix}:node:{name}:alloc"

    @property
    def nodes_version(self) -> str:
        """A counter bumped by every write that changes what the scheduler sees of a node."""
        return f"{self.prefix}:nodes:version"

    @property
    def nodes_changed(self) -> str:
        """Zset: node name -> the ``nodes_version`` of its last such change (the controller reads only
        the nodes changed since its last look; lease expiry, which writes nothing, it checks itself)."""
        return f"{self.prefix}:nodes:changed"

    @property
    def replicated(self) -> str:
        """Counter written right before ``WAIT``, on its connection: WAIT counts that connection's
        writes, and replicas take writes in order, so one holding it holds every write before."""
        return f"{self.prefix}:replicated"

    @property
    def failovers(self) -> str:
        """Redis failovers the services saw, one field per failover (its sentinels' epoch)."""
        return f"{self.prefix}:redis:failovers"

    @property
    def leader(self) -> str:
        return f"{self.prefix}:leader"

    @property
    def leader_token(self) -> str:
        return f"{self.prefix}:leader:token"

    @property
    def leader_version(self) -> str:
        return f"{self.prefix}:leader:version"

    @property
    def requeues(self) -> str:
        return f"{self.prefix}:metrics:requeues"

    @property
    def preemptions(self) -> str:
        return f"{self.prefix}:metrics:preemptions"

    @property
    def tenants(self) -> str:
        return f"{self.prefix}:tenants"

    @property
    def job_uids(self) -> str:
        return f"{self.prefix}:job_uids"

    @property
    def tenant_usage(self) -> str:
        return f"{self.prefix}:tenants:usage"

    @property
    def tenant_status(self) -> str:
        return f"{self.prefix}:tenants:status"

    @property
    def quarantined_jobs(self) -> str:
        return f"{self.prefix}:quarantine:jobs"

    @property
    def quarantined_nodes(self) -> str:
        return f"{self.prefix}:quarantine:nodes"

    def blob(self, hexdigest: str) -> str:
        return f"{self.prefix}:blob:{hexdigest}"

    def blob_jobs(self, hexdigest: str) -> str:
        """Ids of the jobs and job arrays holding a function's call (``lib/blobs.lua``)."""
        return f"{self.prefix}:blob:{hexdigest}:jobs"

    def blob_size(self, hexdigest: str) -> str:
        """What a packed directory holds ("<packed> <bytes> <files>"), kept as long as its blob."""
        return f"{self.prefix}:blobsize:{hexdigest}"

    def blobs_of(self, tenant: str) -> str:
        return f"{self.prefix}:blobs:of:{tenant}"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}:outbox"

    def webhooks(self, part: str) -> str:
        """The webhook sender's keys: cursor, nodes, pending, due, log, secrets."""
        return f"{self.prefix}:webhooks:{part}"

    def doctor(self, part: str) -> str:
        """``fleet doctor``'s keys: ``markers``, ``clock:<node>``."""
        return f"{self.prefix}:doctor:{part}"

    @property
    def acct_days(self) -> str:
        return f"{self.prefix}:acct:days"

    def acct_day(self, day: int) -> str:
        return f"{self.prefix}:acct:{day}"

    @property
    def tokens(self) -> str:
        return f"{self.prefix}:tokens"

    def token(self, token_id: str) -> str:
        return f"{self.prefix}:token:{token_id}"
