"""PgBouncer in front of a cluster's primary: what its pods and the instances share.

The pooler logs applications in with their own roles and passwords, which only PostgreSQL
holds. PgBouncer asks for a role's SCRAM verifier (``auth_query``) as its own role,
:data:`ROLE`, which has no password: it logs in only with the client certificate the
cluster's CA issued for it (``pg_hba`` ``cert``), and may do nothing but run
:data:`LOOKUP`. That function (``SECURITY DEFINER``, owned by the superuser) answers only
for roles that may log in and are neither superusers, replication roles nor Stateward's
own: the superuser's verifier never leaves PostgreSQL, and PgBouncer cannot be used to log
in as any of them. With the verifier PgBouncer checks the client's SCRAM exchange and then
logs in to PostgreSQL with the keys that exchange proved (SCRAM pass-through): no file
anywhere holds a password.

:data:`ENSURE` makes the role and the function; each instance's supervisor runs it on the
primary (it is idempotent), once per start, whether or not a pooler exists yet, so adding
one later waits for nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Final

from stateward.instance import localsql

ROLE: Final = "stateward_pooler"
SCHEMA: Final = "stateward"
LOOKUP: Final = f"{SCHEMA}.pooler_lookup"
AUTH_QUERY: Final = f"SELECT usename, passwd FROM {LOOKUP}($1)"  # noqa: S608 - constants
AUTH_DATABASE: Final = "postgres"
"""Where :data:`LOOKUP` lives and PgBouncer runs :data:`AUTH_QUERY` (``auth_dbname``), so
databases made later need nothing."""
PORT: Final = 6432
"""PgBouncer's port in its pod; the Service serves it on ``v1alpha1.POOLER_PORT``."""
CONFIG_DIR: Final = "/etc/stateward/pooler"
CONFIG_FILE: Final = f"{CONFIG_DIR}/pgbouncer.ini"
TLS_DIR: Final = "/etc/stateward/tls"
ADMIN_ROLE: Final = "stateward_pooler_admin"
"""Who may use PgBouncer's admin console (``PAUSE``, ``RESUME``): the operator, with a client
certificate of the cluster's CA it issues itself. Not a PostgreSQL role; PgBouncer lets it
into its console only, by certificate only."""
CLIENT_STEM: Final = "pooler"
"""``pooler.crt``/``pooler.key`` in ``NAME-tls``: the client certificate of :data:`ROLE`."""

ENSURE: Final = f"""\
do $$ begin
  if not exists (select from pg_roles where rolname = '{ROLE}') then
    create role {ROLE} login;
  end if;
end $$;
create schema if not exists {SCHEMA};
revoke all on schema {SCHEMA} from public;
grant usage on schema {SCHEMA} to {ROLE};
create or replace function {LOOKUP}(name text, out usename name, out passwd text)
  returns setof record
  language sql stable security definer
  set search_path = pg_catalog, pg_temp
as $f$
  select rolname, rolpassword from pg_catalog.pg_authid
  where rolname = $1 and rolcanlogin and not rolsuper and not rolreplication
    and not rolbypassrls and rolname !~ '^(stateward_|pg_)'
    and (rolvaliduntil is null or rolvaliduntil > now())
$f$;
revoke all on function {LOOKUP}(text) from public;
grant execute on function {LOOKUP}(text) to {ROLE}"""  # noqa: S608 - constants
"""Run as the superuser in database :data:`AUTH_DATABASE` on the primary; idempotent."""

STATE: Final = (
    "select case when exists (select from pg_catalog.pg_proc p"  # noqa: S608 - constants
    " join pg_catalog.pg_namespace n on n.oid = p.pronamespace"
    f" where n.nspname = '{SCHEMA}' and p.proname = 'pooler_lookup')"
    " then 'ready' when pg_catalog.pg_is_in_recovery() then 'replica' else 'primary' end"
)
"""``ready`` once the function exists (replicated to every instance), else the role."""

ENSURE_INTERVAL: Final = 5.0


def ensure_once(psql: str, run: Callable[..., Any] | None = None) -> bool:
    """True once :data:`ENSURE` has run in this cluster (seen here, or run here because this
    instance is the primary); False while it cannot be yet (PostgreSQL not answering, or a
    replica waiting for the primary's)."""
    state = localsql.answer(psql, STATE, user="postgres", timeout=10, run=run)
    if state is None:
        return False
    if state.strip() == "ready":
        return True
    if state.strip() != "primary":
        return False
    done = localsql.answer(psql, ENSURE, user="postgres", timeout=30, run=run) is not None
    if not done:
        print("stateward-instance: the pooler's lookup function was not made", file=sys.stderr)
    return done


def ensure_in_background(
    psql: str, stop: threading.Event, interval: float = ENSURE_INTERVAL
) -> threading.Thread:
    """:func:`ensure_once` now and every ``interval`` seconds until it is done or ``stop``
    is set."""

    def loop() -> None:
        while not ensure_once(psql):
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, daemon=True, name="pooler-lookup")
    thread.start()
    return thread
