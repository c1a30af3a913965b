"""One Database reconcile's scope, shared by the Database reconciler
(``controllers.database``) and the MariaDB/MySQL phases (``controllers.mariadb``) without
either importing the other."""

from __future__ import annotations

import dataclasses
from typing import Any

from stateward.api.v1alpha1 import Database, Engine
from stateward.controllers import core
from stateward.controllers.kube import Body
from stateward.specs.mariadb import servers as mysql_spec

RECHECK = 5.0
"""Seconds between looks at servers that are not settled yet (SQL state has no watch)."""


@dataclasses.dataclass(kw_only=True)
class Scope(core.Scope):
    database: Database
    primary: str | None = None
    """The primary the status names (MySQL, MariaDB): read at the start, set by the plan."""
    last_failover: dict[str, Any] | None = None
    """``status.lastFailover``: read at the start, replaced when the operator fails over."""
    switch_below: int | None = None
    """Set when a scale-down waits for the primary to move below this ordinal."""
    diverged: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """``status.divergedVolumes``: read at the start, added to when a server is recloned
    (``controllers.mariadb.reconcile``)."""


class Stop(Exception):
    """A phase found that nothing more can be done until the user acts (already reported)."""


def data_volumes(scope: Scope) -> list[Body]:
    """The servers' volumes (MySQL, MariaDB): the claims their StatefulSet made, recognized
    by its selector labels (a PostgresCluster's of the same name carry another app name; a
    postgres Database's volumes are its PostgresCluster's business)."""
    if scope.database.spec.engine is Engine.POSTGRES:
        return []
    selector = mysql_spec.selector_labels(scope.database)
    return [
        claim
        for claim in scope.owned("PersistentVolumeClaim")
        if all((claim["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
    ]
