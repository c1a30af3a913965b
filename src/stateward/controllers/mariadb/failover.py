"""Who is the primary of a MySQL or MariaDB Database: the operator's failover decision.

Servers start read-only (``specs.mariadb.servers``); each reconcile reads every server's state
(read-only or writable, whom it replicates from, its GTID position) and :func:`plan` decides,
as a pure function of that snapshot, what to change: which server is the primary (the one
labelled so and still reachable; the first ready server when the Database never had one),
making it writable, pointing every other server at it with GTID auto-positioning, making a
writable server that is not the primary read-only again, and the role labels the Services
select on. Reading and changing the servers is ``controllers.mariadb.sql``; the phases
that act on the plan are ``controllers.mariadb.reconcile``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from stateward.api import v1alpha1
from stateward.specs import meta


@dataclasses.dataclass(frozen=True)
class Server:
    """One server as observed: its pod, and what it said over SQL (None: unreachable)."""

    pod: str
    ready: bool
    role: str | None
    writable: bool | None = None
    source: str | None = None
    """The host it replicates from, if it is configured as a replica."""
    replicating: bool = False
    """Both replication threads running."""
    gtid: str = ""
    """What it has applied (MariaDB's gtid_current_pos, MySQL's gtid_executed)."""
    received: str = ""
    """What it has received from its source (applied or still in the relay log)."""
    replica_error: int = 0
    """The replication threads' last error number (0: none)."""
    semi_sync: bool | None = None
    """Whether it waits for a replica to acknowledge its commits (None: unknown, or MySQL)."""

    @property
    def reachable(self) -> bool:
        return self.writable is not None

    @property
    def position(self) -> dict[int, int]:
        """Everything it holds, applied or received: domain -> highest sequence number."""
        merged = positions(self.gtid)
        for domain, seq in positions(self.received).items():
            merged[domain] = max(merged.get(domain, 0), seq)
        return merged


DIVERGED_ERRORS = frozenset({1236, 1950})
"""Replication errors that mean the server holds transactions its source lacks (1236: the
source's binary log does not have the position it asks for; 1950: a GTID out of order in
strict mode). Only a new copy of the data brings it back."""


def positions(gtid: str) -> dict[int, int]:
    """A MariaDB GTID position (``domain-server-seq`` per domain) as domain -> seq. MySQL's
    gtid_executed (``uuid:1-42``) counts the transactions of each source as one domain."""
    found: dict[int, int] = {}
    for index, part in enumerate(p.strip() for p in gtid.split(",") if p.strip()):
        if ":" in part:  # MySQL: uuid:1-42[:50-60]
            last = part.rsplit(":", 1)[1].split("-")[-1]
            found[index] = max(found.get(index, 0), int(last) if last.isdigit() else 0)
            continue
        pieces = part.split("-")
        if len(pieces) == 3 and all(p.isdigit() for p in pieces):
            domain, seq = int(pieces[0]), int(pieces[2])
            found[domain] = max(found.get(domain, 0), seq)
    return found


def at_least(a: dict[int, int], b: dict[int, int]) -> bool:
    """Whether position ``a`` holds everything ``b`` does."""
    return all(a.get(domain, 0) >= seq for domain, seq in b.items())


def _last_transactions(gtid: str) -> dict[int, tuple[int, int]]:
    """A MariaDB GTID position as domain -> (server id, seq) of its last transaction."""
    found: dict[int, tuple[int, int]] = {}
    for part in (p.strip() for p in gtid.split(",")):
        pieces = part.split("-")
        if len(pieces) == 3 and all(p.isdigit() for p in pieces):
            found[int(pieces[0])] = (int(pieces[1]), int(pieces[2]))
    return found


def caught_up(applied: str, written: str) -> bool:
    """MariaDB: whether a server at ``applied`` (its gtid_current_pos) has everything a fenced
    primary at ``written`` wrote — the very same last transaction in every domain.

    Not MASTER_GTID_WAIT: it looks only at gtid_slave_pos, what the server applied as a
    replica, so a former primary holding the same transactions in its own binary log (the
    new primary wrote none since the failover) never reaches it. And not a higher sequence
    number: that server would hold transactions the primary never had (a former primary's
    unacknowledged tail), which the primary's replicas would then receive."""
    mine = _last_transactions(applied)
    return all(mine.get(domain) == last for domain, last in _last_transactions(written).items())


@dataclasses.dataclass(frozen=True)
class Plan:
    primary: str | None
    promote: str | None = None
    failover_from: str | None = None
    """Set when ``promote`` replaces a primary that was lost or restarted."""
    follow: tuple[str, ...] = ()
    fence: tuple[str, ...] = ()
    reclone: tuple[str, ...] = ()
    """Servers whose data diverged from the primary's: their volume is made anew."""
    labels: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """Pod -> the role label it should carry (None: no role label)."""
    waiting: str | None = None
    """Why no primary could be chosen yet."""


def host_of(database: v1alpha1.Database, pod: str) -> str:
    """The stable DNS name of a server: what replicas connect to."""
    return f"{pod}.{database.headless_service_name}.{database.namespace}.svc.cluster.local"


ordinal = meta.pod_ordinal


def _choose(
    servers: Sequence[Server], previous: str | None, followers: dict[str, int]
) -> tuple[Server | None, bool]:
    """The primary, and whether it must be promoted (made writable) first. ``followers``:
    per server, how many others replicate from it."""
    by_pod = {s.pod: s for s in servers}
    labelled = [s for s in servers if s.role == meta.PRIMARY_ROLE and s.writable]
    writable = [s for s in servers if s.writable]
    if len(labelled) == 1:
        return labelled[0], False
    if len(writable) == 1:
        return writable[0], False  # made writable, not yet labelled (the operator restarted)
    if len(writable) > 1:
        # A former primary came back writable (its node thawed, its partition healed) beside
        # the one promoted in its place. The primary is the one the replicas follow (the
        # failover pointed them there); then the most advanced; then the one the status
        # names. It is already writable: nothing to promote, and the other is fenced. (The
        # former one acknowledged nothing since: its semi-synchronous commits wait for a
        # replica that no longer follows it.)
        chosen = max(writable, key=lambda s: (followers.get(s.pod, 0),
                                              sum(s.position.values()), s.pod == previous,
                                              -ordinal(s.pod)))  # fmt: skip
        return chosen, False
    reachable = [s for s in servers if s.reachable]
    if not reachable:
        return None, False
    if previous is None:
        return min(reachable, key=lambda s: ordinal(s.pod)), True  # a new Database
    # The primary was lost (gone, unreachable) or restarted (read-only, like every server
    # that starts): the most advanced server takes over, the old one only if it is ahead
    # of every other (it holds writes no replica received: taking another would lose them).
    best = max(reachable, key=lambda s: (sum(s.position.values()), s.pod != previous,
                                         -ordinal(s.pod)))  # fmt: skip
    old = by_pod.get(previous)
    if old is not None and old.reachable and not at_least(best.position, old.position):
        return old, True
    return best, True


def plan(database: v1alpha1.Database, servers: Sequence[Server], previous: str | None) -> Plan:
    """What to change, from one snapshot of the servers. ``previous`` is the primary the
    status last named."""
    followers = {
        s.pod: sum(1 for r in servers if r.replicating and r.source == host_of(database, s.pod))
        for s in servers
    }
    primary, promote = _choose(servers, previous, followers)
    if primary is None:
        return Plan(
            primary=None,
            labels={
                s.pod: None for s in servers if s.role == meta.PRIMARY_ROLE and not s.reachable
            },
            waiting=(
                f"the primary {previous} is not reachable and no other server answers"
                if previous
                else "no server answers yet"
            ),
        )
    source = host_of(database, primary.pod)
    others = [s for s in servers if s.pod != primary.pod and s.reachable]
    reclone = tuple(s.pod for s in others if s.replica_error in DIVERGED_ERRORS)
    follow = tuple(
        s.pod for s in others if s.pod not in reclone and (s.source != source or not s.replicating)
    )
    fence = tuple(s.pod for s in others if s.writable)
    labels: dict[str, str | None] = {}
    for s in servers:
        if s.pod == primary.pod:
            wanted: str | None = meta.PRIMARY_ROLE
        elif s.reachable and s.source == source and s.replicating:
            wanted = meta.REPLICA_ROLE
        else:
            wanted = None
        if s.role != wanted:
            labels[s.pod] = wanted
    return Plan(
        primary=primary.pod,
        promote=primary.pod if promote else None,
        failover_from=previous if promote and previous and previous != primary.pod else None,
        follow=follow,
        fence=fence,
        reclone=reclone,
        labels=labels,
    )
