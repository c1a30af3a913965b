"""``stateward.io/v1alpha1``: the PostgresCluster resource as pydantic models.

These models are the single source of truth: the CRD schema in ``config/crd/bases`` is
generated from them (``make manifests``), the operator parses objects with them, and the
builders in ``stateward.specs`` read them. Docstrings and field descriptions become the
schema's descriptions, so they are written for users.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Any

import pydantic
from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from stateward.instance import localsql

GROUP = "stateward.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PostgresCluster"
PLURAL = "postgresclusters"
SINGULAR = "postgrescluster"
SHORT_NAMES = ("pgc",)

FINALIZER = "stateward.io/finalizer"
MAX_REPLICAS = 16
SUPPORTED_MAJOR_VERSIONS = (13, 14, 15, 16, 17, 18)
VERSION_PATTERN = "^(" + "|".join(map(str, SUPPORTED_MAJOR_VERSIONS)) + ")([.][0-9]{1,2})?$"
"""Supported versions: a major from SUPPORTED_MAJOR_VERSIONS, optionally ``.minor``. The one
definition: the CRD's OpenAPI pattern, its CEL rule and the webhook all use it. Written without
backslashes so that it reads the same in Python, Go (RE2) and a CEL string."""
PARAMETER_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)?$"
"""A postgresql.conf parameter name: an identifier, or ``extension.name``. The one definition
for the CRD's CEL rule, the webhook and the model. A name outside it could write other lines
into postgresql.conf (``"x = 1\narchive_command"``), so the API server refuses it without the
operator, and a stored object that has one is never rendered."""
DEFAULT_IMAGE_REPOSITORY = "ghcr.io/stateward/postgres-instance"
SWITCHOVER_ANNOTATION = "stateward.io/switchover"
"""Set on a PostgresCluster to request a switchover: the value is the pod to promote, or
``any`` for the most up-to-date synchronous standby. The operator removes it when done and
reports the result in ``status.switchover`` and Events."""
FENCED_INSTANCES_ANNOTATION = "stateward.io/fenced-instances"
"""Set on a PostgresCluster to fence instances: a JSON list of pod names, or ``["*"]`` for
all. A fenced instance's PostgreSQL is stopped cleanly (a fenced primary hands over to a
synchronous standby first); its pod and volume stay for inspection until it is unfenced."""
BACKUP_ANNOTATION = "stateward.io/backup"
"""Set on a PostgresCluster to request a full backup now: any new value (a timestamp, say)
is a new request. The operator runs it once per value and reports it in
``status.onDemandBackup``, ``LastBackupSucceeded`` and Events (as PGO's backup annotation)."""
REQUEST_ANNOTATIONS = (SWITCHOVER_ANNOTATION, FENCED_INSTANCES_ANNOTATION, BACKUP_ANNOTATION)
"""Annotations that are requests to the operator: a change of one is a change of intent."""


class _Model(pydantic.BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )


class PVCPolicy(enum.StrEnum):
    DELETE = "Delete"
    RETAIN = "Retain"


class DeletionPolicy(_Model):
    """What happens to data when the PostgresCluster is deleted."""

    final_backup: bool | None = None
    """Take a final backup before the cluster goes away; deletion waits until it succeeds.
    Unset: take one when spec.backup configures a repository. true needs spec.backup."""

    persistent_volume_claims: PVCPolicy = PVCPolicy.DELETE
    """Delete the instance volumes after the final backup, or Retain them."""


class PostgreSQLConfig(_Model):
    """PostgreSQL server settings."""

    parameters: dict[str, str] = Field(default_factory=dict)
    """postgresql.conf parameters, e.g. {"max_connections": "200"}. Parameters the operator
    manages itself (listen_addresses, port, wal_level, hot_standby, archive_command, ...)
    are refused."""

    @pydantic.field_validator("parameters")
    @classmethod
    def _names(cls, parameters: dict[str, str]) -> dict[str, str]:
        # Admission (CEL) refuses these; an object stored before that rule must still never
        # reach postgresql.conf, so the model refuses it too and the reconciler skips it.
        for name in parameters:
            if not re.fullmatch(PARAMETER_NAME_PATTERN, name):
                raise ValueError(
                    f"spec.postgresql.parameters: {name!r} is not a PostgreSQL parameter name"
                )
        return parameters


class SynchronousMode(enum.StrEnum):
    PREFERRED = "Preferred"
    REQUIRED = "Required"
    OFF = "Off"


class SynchronousMethod(enum.StrEnum):
    PRIORITY = "Priority"
    QUORUM = "Quorum"


class Synchronous(_Model):
    """Synchronous replication: a commit is acknowledged only after ``number`` standbys have
    it on disk, so losing the primary loses no acknowledged write."""

    mode: SynchronousMode = SynchronousMode.PREFERRED
    """Preferred (the default): commits wait for the synchronous standbys while any is
    streaming; with none left the primary keeps accepting writes, unprotected (Patroni's
    non-strict synchronous_mode). Required: commits wait until a standby is back, so no write
    is ever acknowledged by the primary alone (synchronous_mode_strict). Off: asynchronous
    replication; a failover can lose the last acknowledged commits."""

    number: int = Field(default=1, ge=1, le=MAX_REPLICAS - 1)
    """How many synchronous standbys each commit waits for (at most replicas - 1 are used)."""

    method: SynchronousMethod = SynchronousMethod.PRIORITY
    """Which standbys a commit may wait for. Priority (the default): Patroni names ``number``
    replicas synchronous and the others replicate asynchronously (PostgreSQL's ``FIRST n``);
    when a synchronous standby is lost, commits wait until PostgreSQL notices (1 s without a
    TCP acknowledgement from a node that is off or cut off; wal_sender_timeout, 5 s, for a
    hung one) and Patroni names another, about 3 s. Quorum: every streaming replica may
    acknowledge, and a commit waits for any ``number`` of them (``ANY n (...)``), so losing
    one standby of several costs commits no wait at all; a failover then promotes only a
    replica that enough of the others confirm holds every acknowledged commit (Patroni's
    quorum commit). Status names the replicas ``quorum_standby``."""


IDENTIFIER_PATTERN = localsql.IDENTIFIER_PATTERN
"""A PostgreSQL identifier that needs no quoting: lower case letters, digits, underscores."""
RESERVED_ROLES = ("postgres", "replicator")
RESERVED_DATABASES = ("postgres", "template0", "template1")


REPOSITORY_PATH_PATTERN = "^(/[A-Za-z0-9._-]+)+$"
"""An absolute path in the bucket, e.g. /production/orders."""
CLUSTER_NAME_PATTERN = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A PostgresCluster name (a DNS label)."""
_DATE = "[0-9]{4}-[0-9]{2}-[0-9]{2}"
_TIME = "[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,6})?"
TIMESTAMP_PATTERN = f"^{_DATE}T{_TIME}(Z|[+-][0-9]{{2}}:[0-9]{{2}})$"
"""An RFC 3339 timestamp with seconds and a zone, e.g. 2026-12-02T10:15:00Z."""
RESTORE_POINT_PATTERN = "^[A-Za-z0-9_.-]{1,63}$"


class Restore(_Model):
    """Initialize from another cluster's pgBackRest repository instead of an empty database:
    its latest state (a clone), or a point in time."""

    cluster: str = Field(max_length=63, pattern=CLUSTER_NAME_PATTERN)
    """The cluster whose backups to restore (its pgBackRest stanza is its name). It may be
    running, or deleted (its final backup stays), or this very name. Its repository is in the
    same object store as spec.backup.repository."""

    path: str | None = Field(default=None, max_length=255, pattern=REPOSITORY_PATH_PATTERN)
    """That repository's path in the bucket; /NAMESPACE/CLUSTER by default."""

    target_time: str | None = Field(default=None, max_length=40, pattern=TIMESTAMP_PATTERN)
    """Recover up to this moment and no later (RFC 3339, e.g. "2026-12-02T10:15:00Z").
    Unset, with no restorePoint: replay all the WAL there is (the latest state)."""

    restore_point: str | None = Field(default=None, pattern=RESTORE_POINT_PATTERN)
    """Recover up to this named restore point (made with pg_create_restore_point)."""


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(_Model):
    key: str = Field(max_length=317)
    operator: SelectorOperator
    values: list[str] | None = Field(default=None, max_length=64)


class LabelSelector(_Model):
    """A Kubernetes label selector; empty selects everything."""

    match_labels: dict[str, str] | None = Field(default=None, max_length=32)
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=16)


class IPBlock(_Model):
    cidr: str = Field(max_length=64)
    """An IP range ("10.0.0.0/16")."""
    except_: list[str] | None = Field(default=None, max_length=16, alias="except")
    """Ranges inside ``cidr`` left out."""


class NetworkPeer(_Model):
    """Who may connect, as a NetworkPolicy's ``from`` entry: pods (``podSelector``, in this
    namespace unless ``namespaceSelector`` says which), namespaces, or an IP range."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None


class NetworkPolicySpec(_Model):
    """The NetworkPolicy ``NAME`` on the database pods. Replication, Patroni's REST API and
    MariaDB's clone port are open only to the cluster's own pods (and the REST API and the
    database port to the operator's namespace); the database port to ``clients``."""

    enabled: bool = True
    """On by default; turn it off only where another policy governs these pods' traffic."""

    clients: list[NetworkPeer] | None = Field(default=None, max_length=32)
    """Who may connect to the database port. Unset: every pod in the cluster's namespace.
    ``[]``: nobody but the cluster's own pods and the operator."""

    metrics: list[NetworkPeer] | None = Field(default=None, max_length=32)
    """Who may scrape the metrics port (a PostgreSQL instance's 9187, a MariaDB server's
    9104). Unset: every pod of every namespace (Prometheus usually runs in a namespace of its
    own; the metrics carry no credential). ``[]``: nobody."""


SECRET_NAME_PATTERN = "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"  # noqa: S105 - a pattern
"""A Secret's name (a DNS subdomain)."""


class TLSSpec(_Model):
    """The certificates the servers serve and the clients of the cluster's own roles show.
    By default the cluster has its own CA (``NAME-ca``, made by the operator)."""

    ca_secret_name: str | None = Field(default=None, max_length=253, pattern=SECRET_NAME_PATTERN)
    """Sign with your CA instead: a Secret in the cluster's namespace holding a CA
    certificate and its key, as ``tls.crt`` and ``tls.key`` (what cert-manager writes for a
    Certificate with ``isCA: true``; its ``ca.crt``, the root, is trusted beside it) or as
    ``ca.crt`` and ``ca.key``. RSA or EC. The operator copies it into ``NAME-ca``, signs the
    servers' and clients' certificates with it (never beyond its expiry), and picks up a
    renewed or replaced CA within the resync interval, reloading the servers without a
    restart."""

    server_secret_name: str | None = Field(
        default=None, max_length=253, pattern=SECRET_NAME_PATTERN
    )
    """Serve your own certificate instead of one the cluster's CA signs: a
    ``kubernetes.io/tls`` Secret in the cluster's namespace (what cert-manager writes for a
    Certificate) holding ``tls.crt`` (the certificate, its chain may follow), ``tls.key`` and
    ``ca.crt`` (the root that signed it). It must be valid for the primary Service's name
    (``NAME-primary.NAMESPACE.svc``, the host of the app Secret) and, for a MariaDB Database,
    for its servers' names under the headless Service (a wildcard), which replicas verify;
    add any other name your clients use. The operator copies it into
    ``NAME-tls``, picks up a renewed one within the resync interval and reloads the servers
    without a restart; renewing it is yours (cert-manager does). The roles that log in only
    with a client certificate keep certificates of the cluster's CA (or ``caSecretName``'s),
    and the servers accept client certificates from that CA alone, never from this root."""


class PostgresTLSSpec(TLSSpec):
    """TLS of a PostgresCluster: the certificates, and whether applications may go without."""

    allow_plaintext_clients: bool = False
    """Also accept application logins without TLS (``sslmode=disable``), by password (SCRAM)
    as over TLS. Off by default, and leave it off unless a client cannot speak TLS: what such
    a client sends and reads, queries and rows, crosses the network in the clear. Only the
    application's logins: the superuser, the replication role and the pooler's role still log
    in only over TLS with their client certificates, replication and Patroni's REST API stay
    TLS, and so does the pooler (``spec.pooler``). Changing it rolls the instances, each in
    turn, the primary last after a switchover."""


CONFIG_MAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
"""A key of a ConfigMap's data."""


class ConfigMapKey(_Model):
    """One key of a ConfigMap in the cluster's namespace."""

    name: str = Field(max_length=253, pattern=SECRET_NAME_PATTERN)
    key: str = Field(default="queries.yaml", max_length=253, pattern=CONFIG_MAP_KEY_PATTERN)


class Monitoring(_Model):
    """What each instance's metrics port (9187) serves beyond its own series."""

    custom_queries_config_map: list[ConfigMapKey] = Field(default_factory=list, max_length=8)
    """ConfigMaps of custom queries (postgres_exporter's and CloudNativePG's format: query
    name to ``query``, ``metrics`` with a ``usage`` per column — LABEL, GAUGE or COUNTER —
    and ``primary: true`` to ask only the primary). Served as
    ``stateward_custom_<query>_<column>``. They run as ``stateward_monitor``, a
    ``pg_monitor`` role with read-only, time-limited transactions, never as the superuser.
    Edits are picked up within about a minute; a ConfigMap that does not exist yet serves
    nothing. Changing this list rolls the instances (their volumes change)."""


class PoolMode(enum.StrEnum):
    SESSION = "session"
    TRANSACTION = "transaction"


UPGRADES: dict[int, tuple[int, ...]] = {17: (15,)}
"""For a major, the older majors its default image can upgrade from in place (the image
carries their servers for ``pg_upgrade``). With ``spec.image`` set, the image must carry
the old major's server under ``/usr/lib/postgresql/OLD/bin`` itself."""
POOLER_MAJOR = 17
"""The instance image the pooler runs by default (see ``Pooler.image``)."""
POOLER_PORT = 5432
"""The pooler Service's port: applications change the host, not the port."""


class Pooler(_Model):
    """PgBouncer in front of the primary (``NAME-pooler``, a Deployment and its Service).

    Applications log in with their own role and password, checked by PgBouncer against
    PostgreSQL (``auth_query`` through a lookup function only PgBouncer's own role may run);
    no file holds a password. TLS on both sides: PgBouncer serves the cluster's serving
    certificate (it covers ``NAME-pooler``) and verifies the primary's."""

    instances: int = Field(default=2, ge=1, le=10)
    """PgBouncer pods, spread over the nodes when it can be."""

    pool_mode: PoolMode = PoolMode.TRANSACTION
    """``transaction`` (the default): a server connection serves one transaction at a time
    (session state such as ``SET`` or advisory locks does not carry over); ``session``: one
    client holds one server connection until it leaves."""

    default_pool_size: int = Field(default=20, ge=1, le=10_000)
    """Server connections per user and database, per PgBouncer pod: with ``instances``
    pods, up to ``instances * defaultPoolSize`` reach PostgreSQL; keep that under
    ``max_connections``."""

    max_client_connections: int = Field(default=1000, ge=1, le=100_000)
    """Client connections each PgBouncer pod accepts."""

    image: str | None = Field(default=None, max_length=512)
    """PgBouncer's image; by default the Stateward instance image of PostgreSQL 17, whose
    PgBouncer (1.24, Debian trixie's) looks roles up in one database for all of them
    (``auth_dbname``, PgBouncer 1.19 and later); it speaks to any supported major. An
    image of your own needs that PgBouncer and ``stateward-instance``."""


class AntiAffinity(enum.StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


TOPOLOGY_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A node label key: an optional DNS-subdomain prefix and a slash, then a name."""


class Placement(_Model):
    """Where the instances run. By default each on a node of its own, required: a node lost
    to a fault must never take the primary and its synchronous standby together."""

    anti_affinity: AntiAffinity = AntiAffinity.REQUIRED
    """Required (the default): one instance per ``topologyKey`` value; an instance with no
    such place left stays Pending and Degraded says so (NotEnoughNodes). Preferred: the
    scheduler spreads the instances when it can and stacks them when it cannot, for clusters
    with fewer nodes than instances (one node failing may then take the primary and its
    standby together). A change restarts the instances one by one."""

    topology_key: str = Field(
        default="kubernetes.io/hostname", max_length=317, pattern=TOPOLOGY_KEY_PATTERN
    )
    """The node label whose values count as separate places: ``kubernetes.io/hostname``
    (the default, one per node) or ``topology.kubernetes.io/zone`` (one per zone)."""


class Bootstrap(_Model):
    """What is created when the cluster is first initialized (immutable afterwards)."""

    database: str = Field(default="app", pattern=IDENTIFIER_PATTERN, max_length=63)
    """The application database, owned by ``owner``."""

    owner: str = Field(default="app", pattern=IDENTIFIER_PATTERN, max_length=63)
    """The application role (LOGIN); its credentials are in the Secret ``NAME-app``."""

    restore: Restore | None = None
    """Start from a backup instead of an empty database; needs spec.backup (the object
    store). The application role keeps its data and gets this cluster's password."""


BUCKET_PATTERN = "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
"""An S3 bucket name: 3 to 63 lower case letters, digits, dots and hyphens."""
ENDPOINT_PATTERN = "^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?$"
"""A host name or address with an optional port; no scheme: the store is always HTTPS."""
SECRET_KEY_PATTERN = "^[-._a-zA-Z0-9]+$"  # noqa: S105 - a pattern
"""A key of a Secret's data."""


class UriStyle(enum.StrEnum):
    PATH = "Path"
    HOST = "Host"


class S3Repository(_Model):
    """A pgBackRest repository in an S3-compatible object store, reached over HTTPS."""

    endpoint: str = Field(min_length=1, max_length=260, pattern=ENDPOINT_PATTERN)
    """The store's host name with an optional port, e.g. "s3.eu-west-1.amazonaws.com" or,
    on the local cluster, "stateward-objectstore.kube-system.svc"."""

    bucket: str = Field(min_length=3, max_length=63, pattern=BUCKET_PATTERN)
    """The bucket; it must exist."""

    region: str = Field(default="us-east-1", min_length=1, max_length=64)
    """The bucket's region (S3 signs every request with it)."""

    path: str | None = Field(default=None, max_length=255, pattern=REPOSITORY_PATH_PATTERN)
    """Where in the bucket this cluster's repository lives; /NAMESPACE/NAME by default. Two
    clusters must never share one: pgBackRest refuses to mix their WAL."""

    credentials_secret: str = Field(min_length=1, max_length=253)
    """Secret in the cluster's namespace with the keys accessKeyId and secretAccessKey."""

    ca_key: str | None = Field(default=None, max_length=253, pattern=SECRET_KEY_PATTERN)
    """Key of credentialsSecret holding the PEM certificate of the CA that signed the
    store's certificate (e.g. "ca.crt"); unset: the system's public CAs."""

    uri_style: UriStyle = UriStyle.PATH
    """Path (bucket in the URL path, what most self-hosted stores want) or Host (bucket in
    the host name, virtual-hosted style)."""

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0] if ":" in self.endpoint else self.endpoint

    @property
    def port(self) -> int | None:
        return int(self.endpoint.rsplit(":", 1)[1]) if ":" in self.endpoint else None


class BackupRepository(_Model):
    """Where backups and archived WAL go."""

    s3: S3Repository
    """An S3-compatible object store."""


class BackupRetention(_Model):
    """How many backups to keep; older ones, and the WAL only they needed, are expired after
    each backup."""

    full: int = Field(default=2, ge=1, le=100)
    """Full backups to keep: the recoverable window reaches back to the oldest of them."""


class BackupConfiguration(_Model):
    """pgBackRest backups and continuous WAL archiving."""

    repository: BackupRepository
    """The repository (required): every WAL segment is archived there continuously and
    every backup (scheduled, on demand, final) is written there."""

    retention: BackupRetention = Field(default_factory=BackupRetention)
    """How many backups to keep."""


class ResourceRequirements(_Model):
    """Compute resources of each instance's database container."""

    requests: dict[str, str] = Field(default_factory=dict)
    """Minimum resources, e.g. {"cpu": "500m", "memory": "1Gi"}."""

    limits: dict[str, str] = Field(default_factory=dict)
    """Maximum resources, e.g. {"memory": "2Gi"}."""


class PostgresClusterSpec(_Model):
    """The desired state of a PostgreSQL cluster."""

    version: str = Field(pattern=VERSION_PATTERN, max_length=5)
    """PostgreSQL major version ("16") or major.minor ("16.4"); 13 to 18 are supported."""

    replicas: int = Field(ge=1, le=MAX_REPLICAS)
    """Instances in total: one primary and replicas - 1 streaming replicas."""

    storage_size: str = Field(max_length=32)
    """Size of each instance's data volume, a Kubernetes quantity such as "10Gi". It may
    grow (volumes are expanded in place) but never shrink."""

    storage_class_name: str | None = Field(default=None, max_length=253)
    """StorageClass of the data volumes; the cluster's default when unset. Immutable."""

    backup_schedule: str | None = Field(default=None, max_length=100)
    """When to take scheduled full backups, a 5-field cron expression in UTC ("0 3 * * *").
    Needs spec.backup. No scheduled backups when unset."""

    backup: BackupConfiguration | None = None
    """Backups with pgBackRest: the repository, WAL archiving and retention. No backups and
    no WAL archiving when unset."""

    image: str | None = Field(default=None, max_length=512)
    """Instance image override; by default the Stateward instance image for `version`."""

    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Compute resources of each instance."""

    bootstrap: Bootstrap = Field(default_factory=Bootstrap)
    """The application database and owner created at initialization."""

    synchronous: Synchronous = Field(default_factory=Synchronous)
    """Synchronous replication; on by default (Preferred, one standby)."""

    postgresql: PostgreSQLConfig = Field(default_factory=PostgreSQLConfig)
    """PostgreSQL server settings."""

    deletion_policy: DeletionPolicy = Field(default_factory=DeletionPolicy)
    """What deletion does with the data."""

    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """Who may reach the instances over the network; a NetworkPolicy by default."""

    tls: PostgresTLSSpec = Field(default_factory=PostgresTLSSpec)
    """The CA that signs the instances' certificates, the cluster's own by default; TLS is
    required of every connection over the network."""

    placement: Placement = Field(default_factory=Placement)
    """Where the instances run; one per node, required, by default."""

    monitoring: Monitoring = Field(default_factory=Monitoring)
    """Custom metric queries beside each instance's own metrics."""

    pooler: Pooler | None = None
    """A PgBouncer connection pooler in front of the primary (``NAME-pooler``); none when
    unset, and removing it removes the pooler."""

    @property
    def major_version(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def takes_final_backup(self) -> bool:
        """Whether deletion waits for a final backup (unset: when there is a repository)."""
        wanted = self.deletion_policy.final_backup
        return self.backup is not None if wanted is None else wanted


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    """One aspect of the cluster's state, per Kubernetes API conventions."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class Phase(enum.StrEnum):
    CREATING = "Creating"
    READY = "Ready"
    UPDATING = "Updating"
    FAILING = "Failing"
    DELETING = "Deleting"


class InstanceStatus(_Model):
    """One instance as Patroni reports it in its member record."""

    name: str
    """The pod."""

    role: str | None = None
    """primary, sync_standby, quorum_standby or replica (Patroni's names)."""

    state: str | None = None
    """running, streaming, starting, stopped, ... (Patroni's names), or fenced."""

    timeline: int | None = None
    """The PostgreSQL timeline the instance is on."""

    lag_bytes: int | None = None
    """WAL bytes behind the primary (replicas only)."""

    pending_restart: bool | None = None
    """A changed parameter waits for this instance's restart."""

    fenced: bool | None = None
    """Fenced on request (``stateward.io/fenced-instances``): PostgreSQL stopped, pod kept."""


class SwitchoverPhase(enum.StrEnum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class SwitchoverStatus(_Model):
    """A planned change of primary (requested by the annotation, a rolling update or a
    scale-down)."""

    phase: SwitchoverPhase
    from_pod: str
    """The primary being replaced."""

    target: str
    """The pod asked to become primary, or "any"."""

    reason: str
    """Why: Requested, RollingUpdate, ScaleDown or Restart."""

    started_at: str
    finished_at: str | None = None
    message: str = ""

    pooler_paused: list[str] | None = None
    """The PgBouncer pods paused for it, while they are (``spec.pooler``)."""


class UpgradePhase(enum.StrEnum):
    STOPPING = "Stopping"
    UPGRADING = "Upgrading"
    STARTING = "Starting"
    CLONING = "Cloning"
    SUCCEEDED = "Succeeded"
    REFUSED = "Refused"
    FAILED = "Failed"


class UpgradeStatus(_Model):
    """An in-place major upgrade: the instances stop, ``pg_upgrade --link`` runs in a Job on
    the primary's volume, the primary starts on the new major, the replicas are cloned anew."""

    phase: UpgradePhase
    from_version: str = Field(alias="from")
    """The version the data ran before (``status.version`` when the upgrade started)."""

    to_version: str = Field(alias="to")
    started_at: str
    finished_at: str | None = None
    message: str = ""


class FailoverStatus(_Model):
    """An unplanned change of primary: Patroni promoted a replica after the primary was lost."""

    from_pod: str
    """The primary that was lost."""

    to_pod: str
    """The replica Patroni promoted."""

    detected_at: str
    """When the operator saw the new primary."""

    cause: str | None = None
    """How the primary was lost, when the operator saw it fail: its pod deleted, its container
    terminated, its node out of service, or its lock no longer renewed."""

    seconds: float | None = None
    """From the operator first seeing the primary fail to seeing the new one (when it saw
    the failure; a node that hangs or loses its network looks healthy until Patroni acts)."""

    lock_released: bool | None = None
    """Whether the operator released the dead primary's leader lock (on proof it could not
    accept writes) instead of waiting for Patroni's ttl."""


class RollingRestartStatus(_Model):
    """A restart rolled through every instance because a parameter needs one."""

    configuration: str
    """Which parameter set it is for (a digest of the parameters)."""

    phase: SwitchoverPhase
    """Running, then Succeeded."""

    restarted: list[str] = Field(default_factory=list)
    """Instances already restarted."""

    started_at: str
    finished_at: str | None = None


class BackupInfo(_Model):
    """One backup in the repository."""

    label: str
    """pgBackRest's label, e.g. 20261202-101500F (F full, D differential, I incremental)."""

    type: str
    """full, diff or incr."""

    started_at: str
    finished_at: str
    size_bytes: int | None = None
    """Size of the database it copies."""

    repository_bytes: int | None = None
    """What it takes in the repository (compressed; an incremental only its changes)."""


class BackupsStatus(_Model):
    """The backup repository, from ``pgbackrest info`` after the last backup."""

    count: int = 0
    """Backups in the repository."""

    full: int = 0
    """Full backups among them."""

    latest: BackupInfo | None = None
    """The newest complete backup."""

    recoverable_from: str | None = None
    """The earliest point a restore can reach: the end of the oldest backup."""

    archived_wal: str | None = None
    """The newest WAL segment in the repository when the backup finished."""

    job: str | None = None
    """The backup Job that reported this."""


class OnDemandBackupStatus(_Model):
    """The last backup requested with the ``stateward.io/backup`` annotation."""

    request: str
    """The annotation's value it answers."""

    job: str | None = None
    """The Job that runs it."""

    phase: SwitchoverPhase
    """Running, Succeeded or Failed."""

    started_at: str
    finished_at: str | None = None
    message: str = ""


class PoolerStatus(_Model):
    """The PgBouncer pooler as its Deployment reports it."""

    host: str
    """Where applications connect instead of the primary Service (port 5432)."""

    instances: int
    ready_instances: int = 0
    pool_mode: PoolMode


class PostgresClusterStatus(_Model):
    """The observed state of a PostgreSQL cluster."""

    phase: Phase | None = None
    """Creating, Ready, Updating, Failing or Deleting."""

    primary_pod: str | None = None
    """The pod that currently runs the primary."""

    replica_pods: list[str] = Field(default_factory=list)
    """The pods that currently run streaming replicas."""

    ready_replicas: int = 0
    """Instances that are ready."""

    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Progressing, Degraded, BackupScheduled and more."""

    last_backup_time: str | None = None
    """When the last backup pgBackRest reports complete finished."""

    on_demand_backup: OnDemandBackupStatus | None = None
    """The last backup requested with the ``stateward.io/backup`` annotation."""

    backups: BackupsStatus | None = None
    """The repository as pgBackRest last reported it: backups kept, the latest one, and
    the recoverable window."""

    observed_generation: int | None = None
    """The spec generation the status describes."""

    pending_restart: list[str] | None = None
    """Instances running with a changed parameter that takes effect only after a restart
    (as Patroni reports it); restart them with ``patronictl restart`` until Stateward rolls
    them itself."""

    final_backup_attempts: int | None = None
    """Final backups started since deletion was requested (drives the retry backoff)."""

    instances: list[InstanceStatus] = Field(default_factory=list)
    """Every instance as Patroni reports it: role, state, timeline, lag."""

    switchover: SwitchoverStatus | None = None
    """The running or last switchover."""

    last_failover: FailoverStatus | None = None
    """The last failover the operator saw."""

    rolling_restart: RollingRestartStatus | None = None
    """The running or last restart rolled for a parameter change."""

    pooler: PoolerStatus | None = None
    """The PgBouncer pooler, when ``spec.pooler`` asks for one."""

    version: str | None = None
    """The PostgreSQL version the data files are of: ``spec.version`` once reached. A
    ``spec.version`` whose major is below it is refused (no downgrade)."""

    upgrade: UpgradeStatus | None = None
    """The running or last major upgrade."""


class _Resource(_Model):
    """What a Stateward resource's children are named after: its metadata, and the three
    Services every data plane has (``NAME-headless``, ``NAME-primary``, ``NAME-replicas``)
    and the applications' ``NAME-app`` Secret."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = API_VERSION
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation", 0))

    @property
    def headless_service_name(self) -> str:
        return f"{self.name}-headless"

    @property
    def primary_service_name(self) -> str:
        return f"{self.name}-primary"

    @property
    def replicas_service_name(self) -> str:
        return f"{self.name}-replicas"

    @property
    def app_secret_name(self) -> str:
        """Connection details for applications: host, port, database, user, password, uri."""
        return f"{self.name}-app"

    @property
    def ca_secret_name(self) -> str:
        """The certificate authority (``ca.crt``, ``ca.key``): only the operator reads it, to
        sign the serving and client certificates."""
        return f"{self.name}-ca"

    @property
    def tls_secret_name(self) -> str:
        """The servers' serving certificate (``tls.crt``, ``tls.key``; signed by the CA, or
        the user's own), what clients trust to verify the servers (``ca.crt``), the CA the
        servers accept client certificates from (``client-ca.crt``) and the client
        certificates, renewed by the operator before they expire."""
        return f"{self.name}-tls"


class PostgresCluster(_Resource):
    """A primary-replica PostgreSQL cluster managed by Stateward."""

    kind: str = KIND
    spec: PostgresClusterSpec
    status: PostgresClusterStatus = Field(default_factory=PostgresClusterStatus)

    @property
    def user_ca_secret_name(self) -> str | None:
        """The user's CA Secret (``spec.tls.caSecretName``) that ``NAME-ca`` copies, if any."""
        return self.spec.tls.ca_secret_name

    @property
    def user_server_secret_name(self) -> str | None:
        """The user's serving certificate Secret (``spec.tls.serverSecretName``) that
        ``NAME-tls`` serves, if any."""
        return self.spec.tls.server_secret_name

    # --- names of the children; every builder and controller takes them from here --------

    @property
    def patroni_config_map_name(self) -> str:
        """Our static Patroni configuration. Not ``NAME-config``: in ConfigMaps mode Patroni
        owns ``{scope}-config`` (its dynamic configuration and timeline history)."""
        return f"{self.name}-patroni"

    @property
    def fencing_config_map_name(self) -> str:
        """The fenced instances, as the instance pods read them (``instance.supervisor``)."""
        return f"{self.name}-fencing"

    @property
    def superuser_secret_name(self) -> str:
        return f"{self.name}-superuser"

    @property
    def replication_secret_name(self) -> str:
        return f"{self.name}-replication"

    @property
    def restapi_secret_name(self) -> str:
        """The credentials of Patroni's REST API, held by the instances and the operator."""
        return f"{self.name}-patroni-api"

    @property
    def instance_account_name(self) -> str:
        return f"{self.name}-instance"

    @property
    def backup_cronjob_name(self) -> str:
        return f"{self.name}-backup"

    @property
    def upgrade_job_name(self) -> str:
        """The Job that runs ``pg_upgrade`` on the primary's volume."""
        return f"{self.name}-upgrade"

    @property
    def final_backup_job_name(self) -> str:
        return f"{self.name}-final-backup"

    def on_demand_backup_job_name(self, request: str) -> str:
        """``NAME-backup-<digest of the request>``: one Job per request value."""
        digest = hashlib.sha256(request.encode()).hexdigest()[:8]
        return f"{self.name[:45]}-backup-{digest}"

    @property
    def backup_account_name(self) -> str:
        """The backup Jobs' identity: it may exec pgBackRest in the instance pods."""
        return f"{self.name}-backup"

    @property
    def backup_stanza(self) -> str:
        """pgBackRest's name for the cluster in its repository."""
        return self.name

    @property
    def restore_source_path(self) -> str | None:
        """The repository path ``spec.bootstrap.restore`` restores from, or None."""
        restore = self.spec.bootstrap.restore
        if restore is None:
            return None
        return restore.path or f"/{self.namespace}/{restore.cluster}"

    @property
    def backup_repository_path(self) -> str | None:
        if self.spec.backup is None:
            return None
        return self.spec.backup.repository.s3.path or f"/{self.namespace}/{self.name}"

    @property
    def pooler_image(self) -> str:
        pooler = self.spec.pooler
        return (pooler.image if pooler else None) or f"{DEFAULT_IMAGE_REPOSITORY}:{POOLER_MAJOR}"

    @property
    def pooler_name(self) -> str:
        """The pooler's Deployment, Service, ConfigMap and NetworkPolicy."""
        return f"{self.name}-pooler"

    @property
    def pooler_host(self) -> str:
        """The name clients of the pooler connect to and verify (its serving certificate
        covers it whether or not the cluster has a pooler yet)."""
        return f"{self.pooler_name}.{self.namespace}.svc"

    @property
    def leader_config_map_name(self) -> str:
        """Patroni's leader lock (Kubernetes DCS in ConfigMaps mode)."""
        return f"{self.name}-leader"

    @property
    def failover_config_map_name(self) -> str:
        """Patroni's failover record: a requested failover's from and to."""
        return f"{self.name}-failover"

    @property
    def image(self) -> str:
        return self.spec.image or f"{DEFAULT_IMAGE_REPOSITORY}:{self.spec.version}"


# --- Database: one simple API for PostgreSQL, MySQL and MariaDB --------------------------------

DATABASE_KIND = "Database"
DATABASE_PLURAL = "databases"
DATABASE_SINGULAR = "database"
DATABASE_SHORT_NAMES = ("db",)
DATABASE_MAX_REPLICAS = 10
STORAGE_SIZE_PATTERN = "^[0-9]+[KMGT]i$"
"""A binary quantity: digits and Ki, Mi, Gi or Ti ("10Gi")."""


class Engine(enum.StrEnum):
    POSTGRES = "postgres"
    MYSQL = "mysql"
    MARIADB = "mariadb"


ENGINE_MAJOR_VERSIONS: dict[Engine, tuple[str, ...]] = {
    Engine.POSTGRES: tuple(str(m) for m in SUPPORTED_MAJOR_VERSIONS),
    Engine.MYSQL: ("8.0", "8.4"),
    Engine.MARIADB: ("10.6", "10.11", "11.4", "11.8"),
}
"""The versions each engine supports, as majors: PostgreSQL's "17", MySQL's "8.4" and
MariaDB's "10.11" (their release series); a version is a major, optionally with a minor or
patch level ("17.2", "8.4.3", "10.11.9")."""


def engine_version_pattern(engine: Engine) -> str:
    """The versions of ``engine`` as one regular expression (RE2, CEL and Python alike)."""
    majors = "|".join(m.replace(".", "[.]") for m in ENGINE_MAJOR_VERSIONS[engine])
    suffix = "([.][0-9]{1,2})?" if engine is Engine.POSTGRES else "([.][0-9]{1,3})?"
    return f"^({majors}){suffix}$"


def engine_major(engine: Engine, version: str) -> str:
    """The release series a version belongs to: "17" for PostgreSQL, "10.11" for MariaDB."""
    parts = version.split(".")
    return parts[0] if engine is Engine.POSTGRES else ".".join(parts[:2])


class DatabaseStorage(_Model):
    """Each instance's data volume."""

    size: str = Field(max_length=16, pattern=STORAGE_SIZE_PATTERN)
    """Size of each data volume, e.g. "10Gi" (Ki, Mi, Gi or Ti). It may grow (volumes are
    expanded in place) but never shrink."""

    storage_class_name: str | None = Field(default=None, max_length=253)
    """StorageClass of the data volumes; the cluster's default when unset. Immutable."""


class DatabaseSpec(_Model):
    """The desired state of a database server and its replicas."""

    engine: Engine
    """postgres, mysql or mariadb. Immutable."""

    version: str = Field(max_length=12)
    """The engine's version: PostgreSQL "13" to "18", MySQL "8.0" or "8.4", MariaDB "10.6",
    "10.11", "11.4" or "11.8", optionally with a minor or patch level ("17.2", "10.11.9").
    A major change is refused until upgrades exist. PostgreSQL rolls minor updates through
    the pods; MySQL and MariaDB take a new minor when their pods are next replaced."""

    replicas: int = Field(ge=1, le=DATABASE_MAX_REPLICAS)
    """Servers in total: one primary that takes writes and replicas - 1 read replicas."""

    storage: DatabaseStorage
    """Each server's data volume."""

    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """Who may reach the servers over the network; a NetworkPolicy by default. (A postgres
    Database hands it to its PostgresCluster.)"""

    tls: TLSSpec = Field(default_factory=TLSSpec)
    """The CA that signs the servers' certificates; the Database's own by default. PostgreSQL
    and MariaDB (a postgres Database hands it to its PostgresCluster); MySQL serves no TLS
    yet and refuses it."""


class DatabasePhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    UPDATING = "Updating"
    FAILED = "Failed"
    DELETING = "Deleting"


class DatabaseFailover(_Model):
    """A change of primary the operator made because the primary was lost or restarted."""

    from_pod: str
    """The primary that was lost."""

    to_pod: str
    """The server promoted: the most advanced one."""

    at: str
    """When the operator promoted it."""


class DivergedVolume(_Model):
    """A volume the operator kept instead of deleting: its server held transactions the
    primary never had (a former primary's unacknowledged writes)."""

    volume: str
    """The PersistentVolume, kept with reclaim policy Retain."""

    pod: str
    """The server whose volume it was."""

    gtid: str
    """The GTID position that server held."""

    at: str
    """When the operator kept it."""


class DatabaseStatus(_Model):
    """The observed state of a Database."""

    phase: DatabasePhase | None = None
    """Pending (being created), Running, Updating, Failed or Deleting."""

    ready_replicas: int = 0
    """Servers that are ready."""

    primary_pod: str | None = None
    """The pod that takes writes."""

    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Progressing and Degraded."""

    last_failover: DatabaseFailover | None = None
    """The last failover (MySQL, MariaDB; a postgres Database's is in its PostgresCluster)."""

    diverged_volumes: list[DivergedVolume] = Field(default_factory=list)
    """Volumes kept after a failover because they hold transactions the primary never had
    (the ``Diverged`` condition). Each stays listed until you delete its PersistentVolume."""

    observed_generation: int | None = None
    """The spec generation the status describes."""


class Database(_Resource):
    """A database server (PostgreSQL, MySQL or MariaDB) with replicas, managed by Stateward."""

    kind: str = DATABASE_KIND
    spec: DatabaseSpec
    status: DatabaseStatus = Field(default_factory=DatabaseStatus)

    @property
    def user_ca_secret_name(self) -> str | None:
        """The user's CA Secret (``spec.tls.caSecretName``) that ``NAME-ca`` copies, if any."""
        return self.spec.tls.ca_secret_name

    @property
    def user_server_secret_name(self) -> str | None:
        """The user's serving certificate Secret (``spec.tls.serverSecretName``) that
        ``NAME-tls`` serves, if any."""
        return self.spec.tls.server_secret_name

    @property
    def major(self) -> str:
        return engine_major(self.spec.engine, self.spec.version)

    # --- names of the children (and those of every resource: ``_Resource``) ----------------

    @property
    def config_map_name(self) -> str:
        """The server configuration (MySQL and MariaDB)."""
        return f"{self.name}-config"

    @property
    def credentials_secret_name(self) -> str:
        """The root and replication passwords (MySQL and MariaDB), created once."""
        return f"{self.name}-credentials"

    @property
    def image(self) -> str:
        repository = DATABASE_IMAGE_REPOSITORIES[self.spec.engine]
        return f"{repository}:{self.spec.version}"


DATABASE_IMAGE_REPOSITORIES: dict[Engine, str] = {
    Engine.POSTGRES: DEFAULT_IMAGE_REPOSITORY,
    Engine.MARIADB: "ghcr.io/stateward/mariadb-instance",
    Engine.MYSQL: "docker.io/library/mysql",
}
"""Each engine's default image: Stateward's PostgreSQL and MariaDB instance images (built
locally, Containerfiles for registries), MySQL's official image."""
