"""``stateward-instance``: the checks before Patroni, and Patroni started under the supervisor."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pwd
import re
import subprocess as sp
from pathlib import Path

import pytest
import yaml

from stateward.api import v1alpha1
from stateward.instance import cli, patroni, supervisor, wakeup
from stateward.specs.postgres import config as config_spec
from stateward.specs.postgres import statefulset

pytestmark = pytest.mark.unit

POD_ENV = {
    "PATRONI_NAME": "orders-0",
    "PATRONI_KUBERNETES_NAMESPACE": "shop",
    "PATRONI_KUBERNETES_POD_IP": "10.244.1.7",
    "PATRONI_RESTAPI_CONNECT_ADDRESS": "10.244.1.7:8008",
    "PATRONI_POSTGRESQL_CONNECT_ADDRESS": "10.244.1.7:5432",
}
CREDENTIALS = {
    "superuser": ("postgres", "s3cret-superuser"),
    "replication": ("replicator", "s3cret-replication"),
    "restapi": ("stateward", "s3cret-restapi"),
}


def cluster() -> v1alpha1.PostgresCluster:
    return v1alpha1.PostgresCluster.model_validate(
        {
            "apiVersion": v1alpha1.API_VERSION,
            "kind": v1alpha1.KIND,
            "metadata": {"name": "orders", "namespace": "shop", "uid": "0f0e0d0c"},
            "spec": {"version": "15", "replicas": 2, "storageSize": "1Gi"},
        }
    )


class Exec:
    """Stands in for the supervisor: records what it would run, for whom, and the
    environment Patroni would inherit."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, object]]] = []
        self.env: dict[str, str] = {}

    def __call__(self, argv: list[str], **where: object) -> int:
        self.calls.append((list(argv), where))
        self.env = dict(os.environ)
        return 0


@pytest.fixture
def pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Exec:
    """The pod's environment, a rendered patroni.yaml whose bin_dir exists, exec recorded."""
    for name in [*os.environ]:
        if name.startswith("PATRONI_"):
            monkeypatch.delenv(name)
    for name, value in POD_ENV.items():
        monkeypatch.setenv(name, value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "postgres").write_text("")
    tls = tmp_path / "tls"
    tls.mkdir()
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tls / name).write_text("PEM\n")
    document = (
        config_spec.render(cluster(), labels={"app": "x"})
        .replace(patroni.bin_dir(15), str(bin_dir))
        .replace(patroni.TLS_DIR, str(tls))
    )
    (tmp_path / "patroni.yaml").write_text(document)
    for role, (username, password) in CREDENTIALS.items():
        (tmp_path / "credentials" / role).mkdir(parents=True)
        (tmp_path / "credentials" / role / "username").write_text(username)
        (tmp_path / "credentials" / role / "password").write_text(password + "\n")
    programs = tmp_path / "programs"
    programs.mkdir()
    (programs / "patroni").write_text("#!/bin/sh\n")
    (programs / "patroni").chmod(0o755)
    monkeypatch.setenv("PATH", f"{programs}:{os.environ.get('PATH', '')}")
    recorder = Exec()
    monkeypatch.setattr(cli.supervisor, "supervise", recorder)
    monkeypatch.setattr(patroni, "CREDENTIALS_DIR", str(tmp_path / "credentials"))
    monkeypatch.setattr(patroni, "RUNTIME_CONFIG_FILE", str(tmp_path / "runtime.yaml"))
    monkeypatch.setattr(
        cli.run, "__kwdefaults__",
        {**(cli.run.__kwdefaults__ or {}), "credentials_dir": str(tmp_path / "credentials"),
         "runtime_config": str(tmp_path / "runtime.yaml"),
         "postgres_wrapper": str(tmp_path / "stateward-postgres")},
    )  # fmt: skip
    return recorder


def run(tmp_path: Path, *extra: str) -> int:
    return cli.main(["run", "--config", str(tmp_path / "patroni.yaml"), *extra])


def test_patroni_gets_its_credentials_from_the_mounted_files_never_the_environment(
    pod: Exec, tmp_path: Path
) -> None:
    assert run(tmp_path) == 0
    runtime = tmp_path / "runtime.yaml"
    assert pod.calls[0][0][-1] == str(runtime), "Patroni runs the configuration with them"
    assert runtime.stat().st_mode & 0o777 == 0o600, "readable by the instance's user only"
    document = yaml.safe_load(runtime.read_text())
    authentication = document["postgresql"]["authentication"]
    assert authentication["superuser"]["password"] == "s3cret-superuser"
    assert authentication["superuser"]["username"] == "postgres"
    assert authentication["replication"]["password"] == "s3cret-replication"
    assert authentication["superuser"]["sslmode"] == "verify-ca", "merged, not replaced"
    assert document["restapi"]["authentication"] == {
        "username": "stateward",
        "password": "s3cret-restapi",
    }
    assert document["restapi"]["certfile"].endswith("tls.crt")
    # What Patroni (and so PostgreSQL, archive_command, pgBackRest) inherits holds no secret.
    assert not [name for name, value in pod.env.items() if "s3cret" in value]
    assert "s3cret" not in (tmp_path / "patroni.yaml").read_text(), "the ConfigMap's copy"


@pytest.mark.parametrize(("role", "secret"), [("superuser", "NAME-superuser"),
                                               ("restapi", "NAME-patroni-api")])  # fmt: skip
def test_a_missing_or_empty_credential_file_is_named_with_its_secret(
    role: str, secret: str, pod: Exec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "credentials" / role / "password").unlink()
    assert run(tmp_path) == 1
    err = capsys.readouterr().err
    assert f"{role}/password" in err and secret in err and pod.calls == []
    (tmp_path / "credentials" / role / "password").write_text("\n")
    assert run(tmp_path) == 1
    err = capsys.readouterr().err
    assert "is empty" in err and secret in err and "s3cret" not in err and pod.calls == []


def test_run_supervises_patroni_with_the_config_and_no_shell(pod: Exec, tmp_path: Path) -> None:
    assert run(tmp_path) == 0
    assert pod.calls == [
        (
            [str(tmp_path / "programs" / "patroni"), str(tmp_path / "runtime.yaml")],
            {
                "namespace": "shop",
                "cluster": "orders",
                "pod": "orders-0",
                "port": 8008,
                "certificate": pod.calls[0][1]["certificate"],
                # The metrics ask the configured PostgreSQL about the configured data.
                "metrics_from": (str(tmp_path / "bin" / "psql"), "/var/lib/postgresql/data/pgdata"),
                "waker": pod.calls[0][1]["waker"],
            },
        )
    ]
    # Woken when a WAL sender ends, through its own REST API, as the REST API's user.
    waker = pod.calls[0][1]["waker"]
    assert isinstance(waker, wakeup.Waker)
    assert (waker.port, waker.credentials) == (8008, CREDENTIALS["restapi"])
    assert waker.ca_file == patroni.TLS_CA
    # The supervisor watches the certificate Patroni serves, to reload it when renewed.
    watched = pod.calls[0][1]["certificate"]
    assert isinstance(watched, supervisor.Certificate)
    assert (watched.cert, watched.key) == (
        str(tmp_path / "tls/tls.crt"),
        str(tmp_path / "tls/tls.key"),
    )


@pytest.mark.parametrize("name", ["tls.crt", "tls.key"])
def test_a_missing_certificate_file_is_named(
    name: str, pod: Exec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tls" / name).unlink()
    assert run(tmp_path) == 1
    err = capsys.readouterr().err
    assert f"serving certificate's {name} is missing at {tmp_path / 'tls' / name}" in err
    assert "NAME-tls" in err and pod.calls == []


def test_patroni_starts_postgres_with_a_one_second_ack_timeout_for_its_upstream(
    pod: Exec, tmp_path: Path
) -> None:
    assert run(tmp_path) == 0
    document = yaml.safe_load((tmp_path / "runtime.yaml").read_text())
    wrapper = tmp_path / "stateward-postgres"
    assert document["postgresql"]["bin_name"] == {"postgres": str(wrapper)}
    assert document["postgresql"]["bin_dir"] == str(tmp_path / "bin"), "the rest unchanged"
    assert wrapper.stat().st_mode & 0o777 == 0o700
    # The wrapper execs the configured postgres with the option in PGOPTIONS: what the
    # server gets (argv and environment) is checked by running it against a stand-in.
    (tmp_path / "bin" / "postgres").write_text('#!/bin/sh\necho "$PGOPTIONS|$*"\n')
    (tmp_path / "bin" / "postgres").chmod(0o755)

    def started(*argv: str, **env: str) -> str:
        return sp.run(
            [str(wrapper), *argv],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": "/usr/bin:/bin", **env},
        ).stdout

    assert started("-D", "/data dir") == "-c tcp_user_timeout=1000|-D /data dir\n"
    theirs = started("--version", PGOPTIONS="-c tcp_user_timeout=5000")
    assert theirs == "-c tcp_user_timeout=1000 -c tcp_user_timeout=5000|--version\n"


def test_run_defaults_to_the_mounted_config_file() -> None:
    arguments = cli._parser().parse_args(["run"])
    assert arguments.config == patroni.CONFIG_FILE == "/etc/patroni/patroni.yaml"


@pytest.mark.parametrize("name", sorted(cli.REQUIRED_ENVIRONMENT))
def test_a_missing_variable_is_named_in_one_line(
    name: str,
    pod: Exec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(name)
    assert run(tmp_path) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"stateward-instance: {name} is not set (")
    assert err.count("\n") == 1
    assert pod.calls == []


def test_an_empty_variable_is_refused_and_no_secret_is_printed(
    pod: Exec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATRONI_KUBERNETES_POD_IP", "")
    assert run(tmp_path) == 1
    err = capsys.readouterr().err
    assert "PATRONI_KUBERNETES_POD_IP is empty" in err
    assert "s3cret" not in err
    assert pod.calls == []


def test_an_unresolved_pod_ip_reference_is_refused(
    pod: Exec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATRONI_RESTAPI_CONNECT_ADDRESS", "$(PATRONI_KUBERNETES_POD_IP):8008")
    assert run(tmp_path) == 1
    assert "PATRONI_RESTAPI_CONNECT_ADDRESS holds an unresolved" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the Patroni configuration"),
        ("scope: [unclosed\n", "is not valid YAML at line"),
        ("- a list\n", "not a mapping"),
        ("postgresql: {}\n", "sets no scope"),
        ("scope: x\npostgresql: {bin_dir: /nonexistent/16/bin}\n", "has no postgres binary"),
    ],
)
def test_a_bad_config_file_is_one_line(
    content: str | None,
    message: str,
    pod: Exec,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "patroni.yaml"
    if content is None:
        config.unlink()
    else:
        config.write_text(content)
    assert run(tmp_path) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert pod.calls == []


def test_patroni_scope_may_come_from_the_environment(
    pod: Exec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = tmp_path / "tls"
    (tmp_path / "patroni.yaml").write_text(
        f"postgresql: {{}}\nrestapi: {{certfile: {tls}/tls.crt, keyfile: {tls}/tls.key}}\n"
    )
    monkeypatch.setenv("PATRONI_SCOPE", "orders")
    run(tmp_path)
    assert len(pod.calls) == 1


def test_patroni_missing_from_path_exits_127(
    pod: Exec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "programs" / "patroni").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "programs"))
    assert run(tmp_path) == 127
    assert "cannot run patroni: not found" in capsys.readouterr().err
    assert pod.calls == []


def test_the_checked_variables_are_what_the_statefulset_sets() -> None:
    """The contract with specs.postgres.statefulset: every PATRONI_* it sets is checked, and no
    more."""
    sts = statefulset.statefulset(cluster(), config_hash="x")
    [container] = sts["spec"]["template"]["spec"]["containers"]
    names = [entry["name"] for entry in container["env"]]
    assert sorted(cli.REQUIRED_ENVIRONMENT) == sorted(
        name for name in names if name.startswith("PATRONI_")
    )


def test_an_unknown_uid_gets_a_passwd_entry_through_nss_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = tmp_path / "libnss_wrapper.so"
    library.write_text("")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    uid = 54321
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    env = cli.passwd_environment(uid, 54322, directory=str(tmp_path), libraries=[str(library)])
    assert env == {
        "LD_PRELOAD": str(library),
        "NSS_WRAPPER_PASSWD": str(tmp_path / "stateward-passwd"),
        "NSS_WRAPPER_GROUP": str(tmp_path / "stateward-group"),
    }
    passwd = (tmp_path / "stateward-passwd").read_text()
    assert passwd == f"postgres:x:54321:54322:PostgreSQL administrator:{tmp_path}:/bin/sh\n"
    assert (tmp_path / "stateward-group").read_text() == "postgres:x:54322:\n"


def test_a_known_uid_or_a_missing_library_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.passwd_environment(os.getuid(), os.getgid(), directory=str(tmp_path)) == {}
    missing = [str(tmp_path / "absent.so")]
    assert cli.passwd_environment(54321, 1, directory=str(tmp_path), libraries=missing) == {}
    assert "libnss_wrapper is missing" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_run_passes_the_nss_wrapper_environment_to_patroni(
    pod: Exec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NSS_WRAPPER_PASSWD", "")  # so that monkeypatch removes it afterwards
    monkeypatch.setattr(
        cli, "passwd_environment", lambda uid, gid, *, directory: {"NSS_WRAPPER_PASSWD": "/tmp/p"}
    )
    run(tmp_path)
    assert pod.env["NSS_WRAPPER_PASSWD"] == "/tmp/p"
    assert pod.env["PATRONI_NAME"] == "orders-0"


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out == f"stateward-instance {cli.version()}\n"
    assert cli.version() != "unknown"


def test_a_subcommand_is_required() -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2


# --- post-bootstrap: the application role and database ----------------------------------


def test_the_bootstrap_statements_create_the_owner_and_its_database() -> None:
    text = cli.bootstrap_sql("shop", "shopper", "s3cr3t_-X")
    # Idempotent (a restored cluster has both): create what is missing, then set the
    # password of this cluster's Secret, as its SCRAM verifier: the password is nowhere.
    assert "s3cr3t_-X" not in text
    lines = text.splitlines()
    verifier = r"SCRAM-SHA-256\$4096:[A-Za-z0-9+/=]{24}\$[A-Za-z0-9+/=]{44}:[A-Za-z0-9+/=]{44}"
    assert re.fullmatch(f"ALTER ROLE shopper LOGIN PASSWORD '{verifier}';", lines[8]), lines[8]
    lines[8] = "ALTER ROLE shopper LOGIN PASSWORD '<verifier>';"
    assert lines == [
        "SET log_statement = 'none';",
        "SET log_min_duration_statement = -1;",
        "SET log_min_error_statement = 'panic';",
        "DO $$ BEGIN",
        "  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'shopper') THEN",
        "    CREATE ROLE shopper LOGIN;",
        "  END IF;",
        "END $$;",
        "ALTER ROLE shopper LOGIN PASSWORD '<verifier>';",
        "SELECT 'CREATE DATABASE shop OWNER shopper' WHERE NOT EXISTS"
        " (SELECT FROM pg_database WHERE datname = 'shop')\\gexec",
        "REVOKE ALL ON DATABASE shop FROM PUBLIC;",
        "GRANT ALL ON DATABASE shop TO shopper;",
    ]


def test_the_scram_verifier_is_what_a_scram_client_proves_against() -> None:
    # The server side of a SCRAM-SHA-256 exchange (RFC 5802): a client that knows the
    # password proves it against stored_key; one that does not, cannot.
    verifier = cli.scram_verifier("pencil", salt=b"0123456789abcdef")
    scheme, rest = verifier.split("$", 1)
    params, keys = rest.split("$")
    iterations, salt = params.split(":")
    stored_key = base64.b64decode(keys.split(":")[0])
    assert scheme == "SCRAM-SHA-256" and iterations == "4096"
    assert base64.b64decode(salt) == b"0123456789abcdef"

    def proof(password: str, auth_message: bytes) -> bytes:
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), 4096)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
        return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))

    def server_accepts(client_proof: bytes, auth_message: bytes) -> bool:
        signature = hmac.digest(stored_key, auth_message, "sha256")
        client_key = bytes(a ^ b for a, b in zip(client_proof, signature, strict=True))
        return hashlib.sha256(client_key).digest() == stored_key

    message = b"n=,r=nonce,r=nonce-server,s=salt,i=4096,c=biws,r=nonce-server"
    assert server_accepts(proof("pencil", message), message)
    assert not server_accepts(proof("pencils", message), message)
    assert cli.scram_verifier("pencil") != cli.scram_verifier("pencil")  # a fresh salt each


@pytest.mark.parametrize(
    ("database", "owner", "password"),
    [("Shop", "app", "pw"), ("app", "a;drop", "pw"), ("app", "app", "it's"), ("app", "app", "")],
)
def test_the_bootstrap_statements_refuse_what_would_need_quoting(
    database: str, owner: str, password: str
) -> None:
    with pytest.raises(cli.InstanceError) as error:
        cli.bootstrap_sql(database, owner, password)
    assert password not in str(error.value) or not password


def test_post_bootstrap_names_the_missing_environment_and_password_file(tmp_path: Path) -> None:
    with pytest.raises(cli.InstanceError, match="STATEWARD_APP_OWNER"):
        cli.post_bootstrap("postgres://x", {"STATEWARD_APP_DATABASE": "app"})
    env = {"STATEWARD_APP_DATABASE": "app", "STATEWARD_APP_OWNER": "app"}
    with pytest.raises(cli.InstanceError, match="NAME-app") as raised:
        cli.post_bootstrap("postgres://x", env, password_file=str(tmp_path / "missing"))
    assert str(tmp_path / "missing") in str(raised.value)


def test_patroni_runs_the_hook_after_initdb() -> None:
    document = config_spec.configuration(cluster(), labels={})
    assert document["bootstrap"]["post_bootstrap"] == "stateward-instance post-bootstrap"
    assert cli._parser().parse_args(["post-bootstrap", "postgres://x"]).connection == "postgres://x"


def test_the_stanza_is_created_at_bootstrap_only_with_a_repository() -> None:

    from stateward.instance import cli

    calls: list[list[str]] = []

    def run(argv: list[str], **_: object) -> sp.CompletedProcess[str]:
        calls.append(argv)
        return sp.CompletedProcess(argv, 0, "", "")

    assert cli.create_stanza({}, run) is False
    assert calls == []
    assert cli.create_stanza({"PGBACKREST_STANZA": "demo"}, run) is True
    assert calls == [["pgbackrest", "--io-timeout=5", "stanza-create"]]


def test_an_unreachable_repository_does_not_fail_the_bootstrap() -> None:

    from stateward.instance import cli

    def failing(argv: list[str], **_: object) -> sp.CompletedProcess[str]:
        return sp.CompletedProcess(argv, 49, "", "ERROR: [049]: unable to connect")

    def hanging(argv: list[str], **_: object) -> sp.CompletedProcess[str]:
        raise sp.TimeoutExpired(argv, 60)

    assert cli.create_stanza({"PGBACKREST_STANZA": "demo"}, failing) is False
    assert cli.create_stanza({"PGBACKREST_STANZA": "demo"}, hanging) is False


def test_the_backup_keys_reach_pgbackrest_in_a_private_file_only_when_mounted(
    tmp_path: Path,
) -> None:
    key, secret, include = tmp_path / "s3-key", tmp_path / "s3-key-secret", tmp_path / "conf.d"
    assert not cli.write_backup_keys(str(key), str(secret), str(include)), "no repository"
    assert list(include.iterdir()) == [], "an empty include directory: pgBackRest lists it"
    key.write_text("AKIA1\n")
    secret.write_text("s3cret")
    assert cli.write_backup_keys(str(key), str(secret), str(include))
    written = include / "keys.conf"
    assert written.read_text() == "[global]\nrepo1-s3-key=AKIA1\nrepo1-s3-key-secret=s3cret\n"
    assert written.stat().st_mode & 0o777 == 0o600
    assert include.stat().st_mode & 0o777 == 0o700
