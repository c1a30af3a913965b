"""``stateward-instance``: the command an instance pod runs.

``run`` checks what Patroni needs (its YAML, the per-pod environment the StatefulSet sets, a
passwd entry for the uid), then stays as the container's PID 1 with Patroni as its only
child (``supervisor``): the runtime's signals go to Patroni, the container ends when Patroni
does, and Patroni is stopped, the pod kept, while the instance is fenced.

``backup`` is what the backup Jobs run (``instance.backup``).

``post-bootstrap`` is Patroni's hook after initdb: it creates the application role and
database named in the spec, with the password from the ``NAME-app`` Secret.

Runs inside the instance image, with the stateward package and its dependencies.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import importlib.metadata
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import yaml

from stateward.instance import (
    backup,
    localsql,
    patroni,
    pgbackrest,
    pooler,
    supervisor,
    upgrade,
    wakeup,
)

PROGRAM: Final = "stateward-instance"

REQUIRED_ENVIRONMENT: Final[Mapping[str, str]] = {
    "PATRONI_NAME": "the pod's name, from metadata.name",
    "PATRONI_KUBERNETES_NAMESPACE": "the pod's namespace, from metadata.namespace",
    "PATRONI_KUBERNETES_POD_IP": "the pod's IP, from status.podIP",
    "PATRONI_RESTAPI_CONNECT_ADDRESS": "POD_IP:8008",
    "PATRONI_POSTGRESQL_CONNECT_ADDRESS": "POD_IP:5432",
}
"""What the StatefulSet's container sets for Patroni; without any of them Patroni would start
with a wrong identity. Credentials are files (:func:`read_credentials`), not variables."""
CREDENTIAL_SECRETS: Final[Mapping[str, str]] = {
    "superuser": "NAME-superuser",
    "replication": "NAME-replication",
    "restapi": "NAME-patroni-api",
}
"""The Secret each credential directory is projected from (for the error that names it)."""
_ADDRESSES: Final = ("PATRONI_RESTAPI_CONNECT_ADDRESS", "PATRONI_POSTGRESQL_CONNECT_ADDRESS")

NSS_WRAPPER_LIBRARIES: Final = (
    "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so",
    "/usr/lib/aarch64-linux-gnu/libnss_wrapper.so",
    "/usr/lib/libnss_wrapper.so",
)
"""libnss-wrapper of the instance image: a passwd entry for a uid /etc/passwd lacks."""
USER_NAME: Final = "postgres"


class InstanceError(Exception):
    """A one-line reason ``run`` cannot start Patroni, and the exit code to report it with."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def load_configuration(path: str) -> dict[str, object]:
    """Patroni's YAML as a mapping, or one line saying what is wrong with it."""
    try:
        with open(path) as source:
            document = yaml.safe_load(source)
    except OSError as error:
        raise InstanceError(
            f"cannot read the Patroni configuration {path}: {error.strerror}"
            " (the pod mounts it from the cluster's NAME-patroni ConfigMap)"
        ) from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise InstanceError(f"{path} is not valid YAML{where}: {problem}") from error
    if not isinstance(document, dict):
        raise InstanceError(f"{path} holds no Patroni configuration (not a mapping)")
    return document


def check_configuration(document: Mapping[str, object], path: str, env: Mapping[str, str]) -> None:
    """The scope is set, and ``postgresql.bin_dir`` holds a postgres of this image."""
    if not document.get("scope") and not env.get("PATRONI_SCOPE"):
        raise InstanceError(f"{path} sets no scope (and PATRONI_SCOPE is not set)")
    postgresql = document.get("postgresql")
    bin_dir = postgresql.get("bin_dir") if isinstance(postgresql, dict) else None
    if isinstance(bin_dir, str) and bin_dir and not os.path.isfile(f"{bin_dir}/postgres"):
        raise InstanceError(
            f"{path}: postgresql.bin_dir {bin_dir} has no postgres binary: does this"
            " image hold that PostgreSQL major version?"
        )


def check_environment(env: Mapping[str, str]) -> None:
    """Every variable Patroni needs is set and non-empty (values are never printed)."""
    for name, meaning in REQUIRED_ENVIRONMENT.items():
        if not env.get(name):
            state = "is empty" if name in env else "is not set"
            raise InstanceError(f"{name} {state} ({meaning}); the StatefulSet's container sets it")
    for name in _ADDRESSES:
        if "$(" in env[name]:
            raise InstanceError(
                f"{name} holds an unresolved $(...) reference: define PATRONI_KUBERNETES_POD_IP"
                " before it in the container's env"
            )


def passwd_environment(
    uid: int, gid: int, *, directory: str, libraries: Sequence[str] = NSS_WRAPPER_LIBRARIES
) -> dict[str, str]:
    """For a uid without a passwd entry (initdb looks its user up, and refuses otherwise):
    passwd and group files naming it ``postgres`` in ``directory`` and the environment that
    makes libnss_wrapper serve them. Empty when the uid has an entry or the library is
    missing (then initdb says what is wrong)."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        pass
    else:
        return {}
    library = next((path for path in libraries if os.path.isfile(path)), None)
    if library is None:
        print(
            f"{PROGRAM}: uid {uid} has no passwd entry and libnss_wrapper is missing:"
            " initdb will fail",
            file=sys.stderr,
        )
        return {}
    passwd_file = os.path.join(directory, "stateward-passwd")
    group_file = os.path.join(directory, "stateward-group")
    with open(passwd_file, "w") as passwd:
        passwd.write(f"{USER_NAME}:x:{uid}:{gid}:PostgreSQL administrator:{directory}:/bin/sh\n")
    with open(group_file, "w") as group:
        group.write(f"{USER_NAME}:x:{gid}:\n")
    preload = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), library]))
    return {
        "LD_PRELOAD": preload,
        "NSS_WRAPPER_PASSWD": passwd_file,
        "NSS_WRAPPER_GROUP": group_file,
    }


def certificate_files(document: Mapping[str, object]) -> tuple[str, str]:
    """The serving certificate and key Patroni's REST API (and PostgreSQL) use, which exist:
    without them both would refuse to start, each with a message of its own."""
    restapi = document.get("restapi")
    files = (restapi.get("certfile"), restapi.get("keyfile")) if isinstance(restapi, dict) else ()
    if len(files) != 2 or not all(isinstance(path, str) and path for path in files):
        raise InstanceError("the Patroni configuration names no restapi.certfile and keyfile")
    cert, key = str(files[0]), str(files[1])
    for path in (cert, key):
        if not os.path.isfile(path):
            raise InstanceError(
                f"the serving certificate's {os.path.basename(path)} is missing at {path}"
                " (the pod mounts the cluster's NAME-tls Secret, which the operator makes)"
            )
    return cert, key


def read_mounted(path: str, secret: str) -> str:
    """A file of a mounted Secret, stripped; one line naming it and its Secret (never a
    value) when it cannot be read."""
    try:
        with open(path) as source:
            return source.read().strip()
    except OSError as error:
        raise InstanceError(
            f"cannot read {path}: {error.strerror} (the pod mounts it from the cluster's"
            f" {secret} Secret, which the operator makes)"
        ) from None


def read_credentials(directory: str = patroni.CREDENTIALS_DIR) -> dict[str, tuple[str, str]]:
    """Each of Patroni's users' name and password from the mounted Secrets; one line naming
    the missing or empty file and its Secret (never a value) when one is not there. Without
    the REST API's, its unsafe endpoints would be open to anyone who reaches the pod."""
    found: dict[str, tuple[str, str]] = {}
    for name, secret in CREDENTIAL_SECRETS.items():
        values = []
        for field in ("username", "password"):
            path = os.path.join(directory, name, field)
            value = read_mounted(path, secret)
            if not value:
                raise InstanceError(f"{path} is empty: the {secret} Secret lacks its {field}")
            values.append(value)
        found[name] = (values[0], values[1])
    return found


def write_private(path: str, text: str, mode: int = 0o600) -> None:
    """``text`` into ``path``, readable by this user only, from its first byte."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as target:
        os.fchmod(target.fileno(), mode)  # an older file of another mode
        target.write(text)


def write_backup_keys(
    key_file: str = pgbackrest.KEY_FILE,
    secret_file: str = pgbackrest.KEY_SECRET_FILE,
    directory: str = pgbackrest.INCLUDE_DIR,
) -> bool:
    """With a backup repository (its keys mounted), hand pgBackRest the S3 keys in a file of
    its include directory, readable by this user only. Without them (no repository, or a
    Secret not there yet) nothing: PostgreSQL still starts, archiving fails and the operator
    says why."""
    os.makedirs(directory, mode=0o700, exist_ok=True)  # pgBackRest lists it in any case
    try:
        with open(key_file) as key, open(secret_file) as secret:
            text = pgbackrest.keys_conf(key.read().strip(), secret.read().strip())
    except (OSError, ValueError):
        return False
    write_private(os.path.join(directory, "keys.conf"), text)
    return True


def run(
    config: str,
    *,
    supervise: Callable[..., int] | None = None,
    credentials_dir: str = patroni.CREDENTIALS_DIR,
    runtime_config: str = patroni.RUNTIME_CONFIG_FILE,
    postgres_wrapper: str = patroni.POSTGRES_WRAPPER,
) -> int:
    """Check, then run Patroni under the supervisor until it ends; Patroni's exit status.
    Patroni reads ``config`` with the credentials merged in, from ``runtime_config``."""
    check_environment(os.environ)
    document = load_configuration(config)
    check_configuration(document, config, os.environ)
    cert, key = certificate_files(document)
    credentials = read_credentials(credentials_dir)
    runtime = patroni.with_credentials(document, credentials)
    postgresql = document.get("postgresql")
    bin_dir = postgresql.get("bin_dir") if isinstance(postgresql, dict) else None
    if isinstance(bin_dir, str) and bin_dir:
        script = patroni.postgres_wrapper(f"{bin_dir}/postgres")
        write_private(postgres_wrapper, script, mode=0o700)
        runtime = patroni.with_postgres_wrapper(runtime, postgres_wrapper)
    write_private(runtime_config, yaml.safe_dump(runtime, sort_keys=False))
    write_backup_keys()
    os.environ.update(passwd_environment(os.getuid(), os.getgid(), directory=patroni.TMP_DIR))
    program = shutil.which("patroni")
    if program is None:
        path = os.environ.get("PATH", "")
        raise InstanceError(f"cannot run patroni: not found (PATH={path})", code=127)
    sys.stdout.flush()
    sys.stderr.flush()
    return (supervise or supervisor.supervise)(
        [program, runtime_config],
        namespace=os.environ["PATRONI_KUBERNETES_NAMESPACE"],
        cluster=str(document.get("scope") or os.environ.get("PATRONI_SCOPE")),
        pod=os.environ["PATRONI_NAME"],
        port=patroni.RESTAPI_PORT,
        certificate=supervisor.Certificate(cert, key),
        metrics_from=metrics_sources(document),
        waker=wakeup.Waker(patroni.RESTAPI_PORT, credentials["restapi"], patroni.TLS_CA),
    )


def run_pooler(config: str) -> int:
    """PgBouncer with the configuration the operator rendered, supervised."""
    if not os.path.exists(config):
        raise InstanceError(f"{config} does not exist: the pooler's ConfigMap is not mounted")
    pgbouncer = shutil.which("pgbouncer")
    if pgbouncer is None:
        raise InstanceError("pgbouncer is not installed in this image (Debian's pgbouncer)")
    tls = pooler.TLS_DIR
    return supervisor.supervise_pooler(
        [pgbouncer, config],
        certificate=supervisor.Certificate(f"{tls}/tls.crt", f"{tls}/tls.key"),
    )


def metrics_sources(document: dict[str, Any]) -> tuple[str, str] | None:
    """psql of the configured PostgreSQL and the data directory, for the metrics; None if
    the configuration names neither (the checks above refuse such a configuration)."""
    postgresql = document.get("postgresql") or {}
    bin_dir, data_dir = postgresql.get("bin_dir"), postgresql.get("data_dir")
    if not bin_dir or not data_dir:
        return None
    return os.path.join(str(bin_dir), "psql"), str(data_dir)


SCRAM_ITERATIONS: Final = 4096
"""PostgreSQL's own default (``scram_iterations``)."""


def scram_verifier(password: str, *, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677, as
    libpq's ``PQencryptPasswordConn`` makes it). Sent instead of the password, what any log
    line could show is a verifier, from which a 43-character random password cannot be had.
    The operator's passwords are ASCII, which SASLprep leaves as they are."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def bootstrap_sql(database: str, owner: str, password: str) -> str:
    """The statements that create the application role and database (fed to psql on stdin,
    so the password is in no process's arguments). The role gets the password's SCRAM
    verifier, never the password itself, and the session logs no statement text: not by
    ``log_statement``, not as a slow statement, not beside an error."""
    for what, value in (("database", database), ("owner", owner)):
        if not re.fullmatch(localsql.IDENTIFIER_PATTERN, value):
            raise InstanceError(f"the application {what} {value!r} is not a plain identifier")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", password):
        raise InstanceError("the application password holds characters the operator never makes")
    # Idempotent: a cluster restored from a backup has them already; the role then gets
    # this cluster's password (its Secret's), the data stays as it was.
    return (
        "SET log_statement = 'none';\n"  # noqa: S608 - checked identifiers
        "SET log_min_duration_statement = -1;\n"
        "SET log_min_error_statement = 'panic';\n"
        "DO $$ BEGIN\n"
        f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{owner}') THEN\n"
        f"    CREATE ROLE {owner} LOGIN;\n"
        "  END IF;\n"
        "END $$;\n"
        f"ALTER ROLE {owner} LOGIN PASSWORD '{scram_verifier(password)}';\n"
        f"SELECT 'CREATE DATABASE {database} OWNER {owner}'"
        f" WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{database}')\\gexec\n"
        f"REVOKE ALL ON DATABASE {database} FROM PUBLIC;\n"
        f"GRANT ALL ON DATABASE {database} TO {owner};\n"
    )


def post_bootstrap(
    connection: str, env: Mapping[str, str], *, password_file: str = patroni.APP_PASSWORD_FILE
) -> int:
    """Patroni's ``post_bootstrap`` hook: make the application role and database, with the
    password from the mounted ``NAME-app`` Secret."""
    missing = [
        name for name in (patroni.APP_DATABASE_ENV, patroni.APP_OWNER_ENV) if not env.get(name)
    ]
    if missing:
        raise InstanceError(f"post-bootstrap needs {', '.join(missing)} in the environment")
    password = read_mounted(password_file, "NAME-app")
    statements = bootstrap_sql(env[patroni.APP_DATABASE_ENV], env[patroni.APP_OWNER_ENV], password)
    result = subprocess.run(
        ["psql", connection, "-X", "-q", "-v", "ON_ERROR_STOP=1"],
        input=statements,
        text=True,
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        # psql's error names the statement's object, never the password (the statements
        # themselves are not echoed: no -a/-e).
        raise InstanceError(f"post-bootstrap failed: {result.stderr.strip()[-500:]}")
    print(
        f"{PROGRAM}: created role {env[patroni.APP_OWNER_ENV]} and database"
        f" {env[patroni.APP_DATABASE_ENV]}"
    )
    create_stanza(env)
    return 0


def restore(
    *,
    stanza: str,
    path: str,
    target_time: str | None,
    restore_point: str | None,
    run: Callable[..., Any] = subprocess.run,
) -> int:
    """Restore the source's backup into the (empty) data directory; pgBackRest's output goes
    to the pod's log. Patroni starts PostgreSQL on it when this succeeds."""
    os.makedirs(patroni.DATA_DIR, mode=0o700, exist_ok=True)
    argv = pgbackrest.restore_argv(
        stanza=stanza,
        path=path,
        data_dir=patroni.DATA_DIR,
        target_time=target_time,
        restore_point=restore_point,
    )
    target = target_time or restore_point or "the end of its archived WAL"
    print(f"{PROGRAM}: restoring {stanza} from {path} up to {target}", flush=True)
    code = int(run(argv, check=False).returncode)
    if code != 0:
        print(f"{PROGRAM}: pgbackrest restore failed (exit code {code})", flush=True)
    return code


STANZA_TIMEOUT: Final = 15.0
"""A reachable repository answers in a second or two; an unreachable one must not hold the
new cluster's bootstrap (Patroni waits for this hook) for pgBackRest's minutes of retries."""


def create_stanza(env: Mapping[str, str], run: Callable[..., Any] = subprocess.run) -> bool:
    """With a repository, create pgBackRest's stanza right away, so archiving works from the
    first WAL segment instead of failing until the first backup creates it. Best effort: an
    unreachable repository must not fail the bootstrap (archiving retries, the backup Job
    creates the stanza too, and the operator reports what fails)."""
    if not env.get("PGBACKREST_STANZA"):
        return False
    problem = pgbackrest.stanza_command(
        "stanza-create", timeout=STANZA_TIMEOUT, options=["--io-timeout=5"], run=run
    )
    if problem is not None:
        print(f"{PROGRAM}: {problem}")
        return False
    print(f"{PROGRAM}: created the pgBackRest stanza {env['PGBACKREST_STANZA']}")
    return True


def version() -> str:
    try:
        return importlib.metadata.version("stateward")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM, description="What a Stateward PostgreSQL instance pod runs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _with_config(
        commands.add_parser(
            "run", help="check the pod's configuration, then run Patroni (stopped while fenced)"
        ),
        patroni.CONFIG_FILE,
        "Patroni's YAML",
    )
    hook = commands.add_parser(
        "post-bootstrap",
        help="Patroni's post_bootstrap hook: create the application role and database",
    )
    hook.add_argument("connection", help="the superuser connection string Patroni passes")
    backup_parser = commands.add_parser(
        "backup", help="take a pgBackRest backup in the cluster's primary (the backup Jobs)"
    )
    backup_parser.add_argument("--cluster", required=True, help="the PostgresCluster's name")
    backup_parser.add_argument(
        "--container", required=True, help="the instance container to run pgBackRest in"
    )
    backup_parser.add_argument("--stanza", required=True, help="pgBackRest's stanza")
    backup_parser.add_argument(
        "--type", dest="backup_type", choices=backup.BACKUP_TYPES, default="full"
    )
    restore_parser = commands.add_parser(
        "restore", help="Patroni's custom bootstrap: pgbackrest restore into the data directory"
    )
    restore_parser.add_argument("--stanza", required=True, help="the source cluster's stanza")
    restore_parser.add_argument("--path", required=True, help="its repository path")
    target = restore_parser.add_mutually_exclusive_group()
    target.add_argument("--target-time", help="recover up to this RFC 3339 time")
    target.add_argument("--restore-point", help="recover up to this named restore point")
    _with_config(
        commands.add_parser(
            "pooler", help="run PgBouncer (a pooler pod), reloading it when its certificate renews"
        ),
        pooler.CONFIG_FILE,
        "pgbouncer.ini",
    )
    upgrade_parser = commands.add_parser(
        "upgrade",
        help="pg_upgrade the cleanly stopped data directory to a newer major (the upgrade Job)",
    )
    upgrade_parser.add_argument("--from", dest="old", type=int, required=True, help="its major")
    upgrade_parser.add_argument("--to", dest="new", type=int, required=True, help="the new major")
    upgrade_parser.add_argument("--data-dir", default=patroni.DATA_DIR, help="PGDATA")
    commands.add_parser("version", help="print the stateward version")
    return parser


def _with_config(command: argparse.ArgumentParser, default: str, what: str) -> None:
    command.add_argument(
        "--config", default=default, metavar="PATH", help=f"{what} (default {default})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.command == "version":
        print(f"{PROGRAM} {version()}")
        return 0
    try:
        if arguments.command == "post-bootstrap":
            return post_bootstrap(arguments.connection, os.environ)
        if arguments.command == "restore":
            return restore(
                stanza=arguments.stanza,
                path=arguments.path,
                target_time=arguments.target_time,
                restore_point=arguments.restore_point,
            )
        if arguments.command == "pooler":
            return run_pooler(arguments.config)
        if arguments.command == "upgrade":
            return upgrade.main(arguments.old, arguments.new, data_dir=arguments.data_dir)
        if arguments.command == "backup":
            return backup.main(
                cluster=arguments.cluster,
                container=arguments.container,
                stanza=arguments.stanza,
                backup_type=arguments.backup_type,
            )
        return run(arguments.config)
    except InstanceError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return error.code


if __name__ == "__main__":
    sys.exit(main())
