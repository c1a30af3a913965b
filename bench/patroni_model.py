"""The bare-Patroni lab (:mod:`bench.patroni_lab`) as data and pure logic: the faults it
injects, its members and timings, Patroni's cluster-wide configuration and the Patroni it
installs (the instance image's pins with the etcd3 DCS); how it reads Patroni's ``GET
/cluster`` and ``GET /patroni`` (:class:`ClusterView`, :func:`healthy`, a poll
:class:`Round`, who claims to be primary, when a new primary showed); and the summary of one
fault's runs. Nothing here starts a process or opens a connection."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.dataplane import median_max
from stateward.api.validation import OPERATOR_PARAMETERS
from stateward_local.images import catalog

FAULTS = ("switchover", "postgres-kill", "node-loss", "node-freeze")
MEMBERS = ("m1", "m2", "m3")
SCOPE = "lab"
OS_USER = "postgres"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PRIMARY_ROLES = frozenset({"primary", "master"})
POLL = 0.2
REST_TIMEOUT = 0.5
WRITE_INTERVAL = 0.01
"""Pause between two inserts, so the writer does not take a core of the two."""
STATEMENT_TIMEOUT = 3.0
"""An insert not acknowledged by then is abandoned (the connection closed, a new one made):
an insert sent to a frozen primary would otherwise wait forever."""
CONNECT_TIMEOUT = 2
HEALTHY_TIMEOUT = 240.0
NEW_PRIMARY_TIMEOUT = 120.0

DCS: dict[str, Any] = {
    "ttl": 20,
    "loop_wait": 1,
    "retry_timeout": 5,
    "primary_start_timeout": 10,
    "synchronous_mode": True,
    "synchronous_mode_strict": False,
    "synchronous_node_count": 1,
    "postgresql": {
        "use_pg_rewind": True,
        "use_slots": True,
        # The parameters of our instances, but for the socket directory (one per member).
        "parameters": {k: v for k, v in OPERATOR_PARAMETERS.items() if "socket" not in k},
    },
}
"""Patroni's cluster-wide configuration (``bootstrap.dcs``), as recorded in the results."""


def lab_requirements(image_requirements: Sequence[str]) -> list[str]:
    """The instance image's Patroni pins with the etcd3 DCS instead of Kubernetes."""
    return [r.replace("[kubernetes,", "[etcd3,") for r in image_requirements]


REQUIREMENTS = lab_requirements(catalog.PATRONI_REQUIREMENTS)


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """One member's ``GET /cluster``: the leader, the synchronous standbys, every member's
    role and state."""

    leader: str | None
    sync: tuple[str, ...]
    members: dict[str, tuple[str, str]]

    def state(self, name: str) -> str | None:
        return self.members.get(name, ("", None))[1]


def parse_cluster(body: dict[str, Any]) -> ClusterView:
    members = {
        str(m["name"]): (str(m.get("role", "")), str(m.get("state", "")))
        for m in body.get("members") or []
    }
    leaders = [n for n, (role, _) in members.items() if role in ("leader", "standby_leader")]
    sync = tuple(sorted(n for n, (role, _) in members.items() if role == "sync_standby"))
    return ClusterView(leaders[0] if leaders else None, sync, members)


def healthy(view: ClusterView | None, names: Iterable[str]) -> bool:
    """Every member listed, the leader running, exactly one synchronous standby, and every
    other member streaming from the leader."""
    if view is None or view.leader is None or sorted(view.members) != sorted(names):
        return False
    others = [n for n in view.members if n != view.leader]
    return (
        view.state(view.leader) == "running"
        and len(view.sync) == 1
        and all(view.state(n) == "streaming" for n in others)
    )


@dataclasses.dataclass(frozen=True)
class Round:
    """One poll of every member: its own ``GET /patroni`` and its ``GET /cluster`` (None when
    it did not answer in time, or was not asked: a frozen member)."""

    t: float
    own: dict[str, dict[str, Any] | None]
    views: dict[str, ClusterView | None]


def claims_primary(own: dict[str, Any] | None) -> bool:
    return own is not None and own.get("role") in PRIMARY_ROLES and own.get("state") == "running"


def primaries(round_: Round) -> list[str]:
    """The members that report themselves a running primary in this round."""
    return sorted(n for n, own in round_.own.items() if claims_primary(own))


def view_leaders(round_: Round) -> set[str]:
    """The leaders named by the members' ``GET /cluster`` in this round (each from that
    member's cached view of the DCS: they may disagree for a moment)."""
    return {v.leader for v in round_.views.values() if v is not None and v.leader is not None}


def new_primary(
    rounds: Sequence[Round], old: str, old_start: str | None, since: float
) -> tuple[float, str] | None:
    """When, and which, the first round at or after ``since`` showed a primary other than
    ``old``'s pre-fault postmaster: a ``GET /cluster`` naming another, running leader; or
    ``old`` itself reporting a running primary whose postmaster started anew."""
    for r in rounds:
        if r.t < since:
            continue
        for view in r.views.values():
            if view and view.leader and view.leader != old and view.state(view.leader) == "running":
                return r.t, view.leader
        own = r.own.get(old) or {}
        if claims_primary(own) and own.get("postmaster_start_time") != old_start:
            return r.t, old
    return None


def descendants(pid: int, children_of: Callable[[int], Iterable[int]]) -> list[int]:
    """``pid`` and every process below it, parents first."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        if current not in found:
            found.append(current)
            queue.extend(children_of(current))
    return found


def summarize(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One fault's runs in a few numbers."""
    return {
        "runs": len(entries),
        "downtime_s": median_max([e["downtime_s"] for e in entries]),
        "new_primary_s": median_max([e["new_primary_s"] for e in entries]),
        "lost": sum(e["lost"] for e in entries),
        "acknowledged": sum(e["acknowledged"] for e in entries),
        "two_primaries_runs": sum(bool(e["two_primaries"]) for e in entries),
        "same_member_runs": sum(bool(e["same_member"]) for e in entries),
    }
