"""A dynamic provisioner of node-local directories for the local cluster's real nodes.

Every node of the local cluster runs on this one machine, so a volume "on node N" is simply a
directory ``ROOT/N/<pv-name>`` of the host. This host process serves the StorageClass
``stateward-local`` (provisioner ``stateward.io/local``, see ``storage_class``):

* **Provision.** The class binds ``WaitForFirstConsumer``: once the scheduler has picked a
  node for a pod that uses a pending claim, it annotates the claim with
  ``volume.kubernetes.io/selected-node``, and kube-controller-manager's PV controller, which
  has no in-tree plugin for ``stateward.io/local``, annotates it with
  ``volume.kubernetes.io/storage-provisioner: stateward.io/local`` and waits for an external
  provisioner. This one creates the directory (mode 0777: pods run as arbitrary non-root
  uids and ``fsGroup`` does not apply to local volumes) and a ``local`` PersistentVolume
  pinned to that node with a ``claimRef`` to the claim; the PV controller then binds the two.
* **Delete.** A volume it provisioned that is ``Released`` with reclaim policy ``Delete``
  has its directory removed (only a directory ``ROOT/<node>/<pv-name>``, never a path outside
  ROOT or through a symlink) and is then deleted.
* **Expand.** See ``expansion_status_patch``: kube-controller-manager has no expandable plugin
  for ``local`` volumes and leaves expansion to an external resizer, which is this process.

It is level-triggered: it lists and watches claims and volumes (re-listing on any error or
``410 Gone``, and in full every ``RESYNC_SECONDS``), decides from the whole picture what to
do (``plan``, a pure function) and does it idempotently, logging one line per action.

Run it as ``python -m stateward.local.provisioner --kubeconfig PATH --root DIR``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import ssl
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml
from lightkube.utils import quantity as lightkube_quantity

PROVISIONER = "stateward.io/local"
STORAGE_CLASS = "stateward-local"
RESYNC_SECONDS = 30.0
RETRY_SECONDS = 2.0

ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# The claim conditions an expansion owns (kube's ``knownResizeConditions``); a finished
# expansion removes them all.
RESIZE_CONDITIONS = frozenset(
    {"Resizing", "FileSystemResizePending", "ControllerResizeError", "NodeResizeError"}
)

Object = dict[str, Any]


def storage_class(default: bool = False) -> Object:
    """The StorageClass this provisioner serves (the local cluster creates it)."""
    metadata: Object = {"name": STORAGE_CLASS}
    if default:
        metadata["annotations"] = {ANN_DEFAULT_CLASS: "true"}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": metadata,
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
    }


# --- quantities -----------------------------------------------------------------------------


def parse_quantity(value: object) -> Decimal | None:
    """The value of a Kubernetes quantity ("10Gi", "500M", "1e3"), or None if not one:
    lightkube's parser, None instead of its ValueError. (``stateward.api.validation`` wraps it
    the same way, but the ``local`` layer may not import the API layer.)"""
    if not isinstance(value, str):
        return None
    try:
        return lightkube_quantity.parse_quantity(value)
    except ValueError:
        return None


def quantity_greater(left: object, right: object) -> bool:
    """Whether quantity ``left`` exceeds ``right``; an absent or malformed ``right`` counts as
    zero, a malformed ``left`` as never greater."""
    have = parse_quantity(left)
    if have is None:
        return False
    other = parse_quantity(right)
    return have > (other if other is not None else Decimal(0))


# --- pure decisions -------------------------------------------------------------------------

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def claim_key(pvc: Mapping[str, Any]) -> str:
    return f"{_meta(pvc).get('namespace')}/{_meta(pvc).get('name')}"


def pv_name(pvc: Mapping[str, Any]) -> str:
    """The name of the volume provisioned for ``pvc`` (as kube-controller-manager names it)."""
    return f"pvc-{_meta(pvc)['uid']}"


def volume_path(root: Path, node: str, name: str) -> Path:
    return root / node / name


def claim_is_ours(pvc: Mapping[str, Any], class_name: str = STORAGE_CLASS) -> bool:
    """Whether ``pvc`` is for this provisioner: its storage-provisioner annotation (set by
    kube-controller-manager from the class) names us, or, before that annotation is set,
    its class is the one we serve. A claim annotated for another provisioner never is."""
    annotations = _annotations(pvc)
    provisioner = annotations.get(ANN_STORAGE_PROVISIONER) or annotations.get(
        ANN_BETA_STORAGE_PROVISIONER
    )
    if provisioner:
        return bool(provisioner == PROVISIONER)
    return bool(_spec(pvc).get("storageClassName") == class_name)


def volume_is_ours(pv: Mapping[str, Any]) -> bool:
    return _annotations(pv).get(ANN_PROVISIONED_BY) == PROVISIONER


def desired_pv(pvc: Mapping[str, Any], node: str, root: Path) -> Object:
    """The PersistentVolume that satisfies ``pvc`` with a directory on ``node``."""
    meta, spec = _meta(pvc), _spec(pvc)
    name = pv_name(pvc)
    request = ((spec.get("resources") or {}).get("requests") or {})["storage"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {ANN_PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": request},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec.get("storageClassName") or STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "local": {"path": str(volume_path(root, node, name))},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }


def removable_path(root: Path, pv: Mapping[str, Any]) -> Path | None:
    """The directory of ``pv`` if it is exactly ``root/<node>/<pv-name>`` (lexically: no
    ``..``, nothing outside ``root``); None otherwise. ``root`` must be absolute and resolved;
    symlinks are checked separately when removing."""
    text = (_spec(pv).get("local") or {}).get("path")
    if not isinstance(text, str) or not text.startswith("/"):
        return None
    path = Path(text)
    if ".." in path.parts or Path(os.path.normpath(text)) != path:
        return None
    try:
        relative = path.relative_to(root)
    except ValueError:
        return None
    if len(relative.parts) != 2 or relative.parts[1] != _meta(pv).get("name"):
        return None
    if not _NODE_NAME.fullmatch(relative.parts[0]):
        return None
    return path


def expansion_status_patch(pvc: Mapping[str, Any], size: str) -> Object:
    """The merge patch of the claim's status that finishes an expansion to ``size``.

    A volume here is a directory with no size of its own: nothing is resized, neither in the
    "controller" step (the PV's capacity is simply raised) nor on the node, so an expansion
    finishes at once, as the CSI external-resizer finishes one whose driver needs no node
    expansion (``markOverallExpansionAsFinished``):

    * ``status.capacity.storage`` becomes the new size;
    * ``status.allocatedResources.storage`` records it too (the resizer sets it when it starts;
      the quota evaluator charges the larger of it and the request);
    * ``status.allocatedResourceStatuses.storage`` is removed (no expansion in progress);
    * the resize conditions (``Resizing``, ``FileSystemResizePending``, ``ControllerResizeError``,
      ``NodeResizeError``) are removed, other conditions kept.

    The API server requires none of these fields; the patch carries the claim's
    resourceVersion so it fails rather than overwrite a newer status (the conditions list is
    replaced whole).
    """
    status = _status(pvc)
    patch_status: Object = {
        "capacity": {"storage": size},
        "allocatedResources": {"storage": size},
    }
    statuses = dict(status.get("allocatedResourceStatuses") or {})
    if "storage" in statuses:
        del statuses["storage"]
        patch_status["allocatedResourceStatuses"] = (
            {"storage": None} if statuses else None
        )  # None removes the whole map
    conditions = list(status.get("conditions") or [])
    kept = [c for c in conditions if c.get("type") not in RESIZE_CONDITIONS]
    if len(kept) != len(conditions):
        patch_status["conditions"] = kept or None
    patch: Object = {"status": patch_status}
    version = _meta(pvc).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return patch


@dataclasses.dataclass(frozen=True)
class Provision:
    claim: str
    node: str
    pv: Object = dataclasses.field(compare=False)
    path: Path


@dataclasses.dataclass(frozen=True)
class Delete:
    pv: str
    path: Path
    # The PV is already being deleted (it waits for its pv-protection finalizer): only its
    # directory may remain to be removed.
    deleting: bool = False


@dataclasses.dataclass(frozen=True)
class Expand:
    claim: str
    pv: str
    size: str
    # Whether the PV's capacity must still be raised (False when only the claim's status is
    # behind, e.g. after a crash between the two steps).
    grow_pv: bool
    status_patch: Object = dataclasses.field(compare=False)


@dataclasses.dataclass(frozen=True)
class Skip:
    """Something ours that cannot be done: logged once, not retried until it changes."""

    key: str
    reason: str


Action = Provision | Delete | Expand | Skip


def _provision(
    pvc: Mapping[str, Any], volumes: Mapping[str, Any], root: Path, class_name: str
) -> Action | None:
    meta, spec = _meta(pvc), _spec(pvc)
    if meta.get("deletionTimestamp") or spec.get("volumeName"):
        return None
    if _status(pvc).get("phase", "Pending") != "Pending" or not claim_is_ours(pvc, class_name):
        return None
    node = _annotations(pvc).get(ANN_SELECTED_NODE)
    if not node or not meta.get("uid"):
        return None  # WaitForFirstConsumer: no pod scheduled yet
    name = pv_name(pvc)
    if name in volumes:
        return None  # provisioned; the PV controller binds it
    key = claim_key(pvc)
    if not _NODE_NAME.fullmatch(node):
        return Skip(key, f"selected node {node!r} is not a valid node name")
    if spec.get("volumeMode") == "Block":
        return Skip(key, "volumeMode Block is not supported (directories only)")
    if spec.get("selector"):
        return Skip(key, "claims with a selector cannot be provisioned")
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        return Skip(key, "data sources (clones, snapshots) are not supported")
    if parse_quantity(((spec.get("resources") or {}).get("requests") or {}).get("storage")) is None:
        return Skip(key, "the claim requests no valid storage size")
    pv = desired_pv(pvc, node, root)
    return Provision(key, node, pv, volume_path(root, node, name))


def _delete(pv: Mapping[str, Any], root: Path) -> Action | None:
    if not volume_is_ours(pv) or _status(pv).get("phase") != "Released":
        return None
    if _spec(pv).get("persistentVolumeReclaimPolicy") != "Delete":
        return None
    name = str(_meta(pv).get("name"))
    path = removable_path(root, pv)
    if path is None:
        local = (_spec(pv).get("local") or {}).get("path")
        return Skip(f"pv/{name}", f"path {local!r} is not a volume directory under {root}; left")
    return Delete(name, path, deleting=bool(_meta(pv).get("deletionTimestamp")))


def _expand(pvc: Mapping[str, Any], volumes: Mapping[str, Any]) -> Action | None:
    if _meta(pvc).get("deletionTimestamp") or _status(pvc).get("phase") != "Bound":
        return None
    pv = volumes.get(_spec(pvc).get("volumeName") or "")
    if pv is None or not volume_is_ours(pv):
        return None
    if (_spec(pv).get("claimRef") or {}).get("uid") != _meta(pvc).get("uid"):
        return None
    request = ((_spec(pvc).get("resources") or {}).get("requests") or {}).get("storage")
    capacity = (_spec(pv).get("capacity") or {}).get("storage")
    reported = (_status(pvc).get("capacity") or {}).get("storage")
    grow_pv = quantity_greater(request, capacity)
    size = request if grow_pv else capacity
    if not isinstance(size, str) or not quantity_greater(request, reported):
        return None
    return Expand(
        claim_key(pvc),
        str(_meta(pv).get("name")),
        size,
        grow_pv,
        expansion_status_patch(pvc, size),
    )


def plan(
    claims: Iterable[Mapping[str, Any]],
    volumes: Mapping[str, Mapping[str, Any]],
    root: Path,
    class_name: str = STORAGE_CLASS,
) -> list[Action]:
    """What to do, given every claim and every volume (keyed by name) in the cluster."""
    decided: list[Action | None] = []
    for pvc in claims:
        decided.append(_provision(pvc, volumes, root, class_name))
        decided.append(_expand(pvc, volumes))
    decided.extend(_delete(pv, root) for pv in volumes.values())
    return [action for action in decided if action is not None]


# --- the API server -------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text[:300]}")
        self.status = status


@dataclasses.dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it, from a kubeconfig."""

    server: str
    verify: ssl.SSLContext | bool
    headers: dict[str, str]

    def client(self, timeout: httpx.Timeout | float = 10.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.server, verify=self.verify, headers=self.headers, timeout=timeout
        )


def _named(entries: Sequence[Mapping[str, Any]], name: str, field: str) -> Mapping[str, Any]:
    for entry in entries or []:
        if entry.get("name") == name:
            return entry.get(field) or {}
    raise ValueError(f"kubeconfig has no {field} named {name!r}")


def load_kubeconfig(path: Path, scratch: Path) -> Connection:
    """The current context of the kubeconfig at ``path``: server, CA and client certificate
    (files or inline ``-data``; inline keys are written to ``scratch``) or a bearer token."""
    config = yaml.safe_load(path.read_text()) or {}
    context = _named(config.get("contexts", []), config.get("current-context", ""), "context")
    cluster = _named(config.get("clusters", []), context.get("cluster", ""), "cluster")
    user = _named(config.get("users", []), context.get("user", ""), "user")
    base = path.parent

    def file_of(key: str) -> str | None:
        if user.get(f"{key}-data"):
            target = scratch / key
            target.write_bytes(base64.b64decode(user[f"{key}-data"]))
            target.chmod(0o600)
            return str(target)
        value = user.get(key)
        return str(base / value) if value else None

    verify: ssl.SSLContext | bool
    if cluster.get("insecure-skip-tls-verify"):
        verify = False
    else:
        if cluster.get("certificate-authority-data"):
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            verify = ssl.create_default_context(cadata=ca)
        elif cluster.get("certificate-authority"):
            verify = ssl.create_default_context(cafile=str(base / cluster["certificate-authority"]))
        else:
            verify = ssl.create_default_context()
    cert, key = file_of("client-certificate"), file_of("client-key")
    if cert and key:
        if not isinstance(verify, ssl.SSLContext):
            verify = ssl.create_default_context()
            verify.check_hostname = False
            verify.verify_mode = ssl.CERT_NONE
        verify.load_cert_chain(cert, key)
    headers = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}
    return Connection(str(cluster["server"]).rstrip("/"), verify, headers)


def _check(response: httpx.Response, *, allow: Iterable[int] = ()) -> httpx.Response:
    if response.is_success or response.status_code in allow:
        return response
    raise ApiError(response.status_code, response.text)


MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


class Cache:
    """The latest listed-and-watched state of one resource, keyed by namespace/name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, Object] = {}
        self.synced = False

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = _meta(obj)
        return f"{meta.get('namespace')}/{meta['name']}" if meta.get("namespace") else meta["name"]

    def replace(self, items: Iterable[Object]) -> None:
        with self.lock:
            self.items = {self.key(item): item for item in items}
            self.synced = True

    def put(self, obj: Object) -> None:
        with self.lock:
            self.items[self.key(obj)] = obj

    def drop(self, obj: Mapping[str, Any]) -> None:
        with self.lock:
            self.items.pop(self.key(obj), None)

    def snapshot(self) -> dict[str, Object]:
        with self.lock:
            return dict(self.items)


def log(message: str) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{now} {message}", flush=True)


class Watcher(threading.Thread):
    """List, then watch from the list's resourceVersion; re-list when the watch ends (the
    server closes it after ``RESYNC_SECONDS``), fails, or reports ``410 Gone``."""

    def __init__(
        self,
        connection: Connection,
        path: str,
        cache: Cache,
        changed: threading.Event,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"watch {path}", daemon=True)
        self.connection, self.path, self.cache = connection, path, cache
        self.changed, self.stop = changed, stop

    def run(self) -> None:
        timeout = httpx.Timeout(10.0, read=RESYNC_SECONDS + 30)
        failures = 0
        with self.connection.client(timeout) as client:
            while not self.stop.is_set():
                try:
                    self._list_and_watch(client)
                    failures = 0
                except (httpx.HTTPError, ApiError, ValueError, OSError) as error:
                    failures += 1
                    if failures == 1 or failures % 30 == 0:
                        log(f"watch {self.path} failed ({error}); re-listing")
                    self.stop.wait(min(failures, 5))

    def _list_and_watch(self, client: httpx.Client) -> None:
        listed = _check(client.get(self.path)).json()
        self.cache.replace(listed.get("items") or [])
        self.changed.set()
        version = (listed.get("metadata") or {}).get("resourceVersion", "")
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(RESYNC_SECONDS)),
        }
        with client.stream("GET", self.path, params=params) as response:
            _check(response)
            for line in response.iter_lines():
                if self.stop.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 500)
                    if code == 410:
                        return  # Gone: the resourceVersion is too old; re-list at once
                    raise ApiError(code, str(obj.get("message")))
                if kind in ("ADDED", "MODIFIED"):
                    self.cache.put(obj)
                elif kind == "DELETED":
                    self.cache.drop(obj)
                else:
                    continue  # BOOKMARK
                self.changed.set()


class Provisioner:
    """Runs ``plan`` against the cluster whenever claims or volumes change."""

    CLAIMS = "/api/v1/persistentvolumeclaims"
    VOLUMES = "/api/v1/persistentvolumes"

    def __init__(self, connection: Connection, root: Path, class_name: str) -> None:
        self.connection = connection
        self.root = root
        self.class_name = class_name
        self.claims = Cache()
        self.volumes = Cache()
        self.changed = threading.Event()
        self.stop = threading.Event()
        # What has been logged about a skipped or failing action, so a condition that lasts
        # is logged once rather than on every pass.
        self.reported: set[tuple[str, str]] = set()

    def run(self) -> None:
        watchers = [
            Watcher(self.connection, self.CLAIMS, self.claims, self.changed, self.stop),
            Watcher(self.connection, self.VOLUMES, self.volumes, self.changed, self.stop),
        ]
        for watcher in watchers:
            watcher.start()
        log(f"serving storage class {self.class_name} ({PROVISIONER}) under {self.root}")
        wait = RESYNC_SECONDS
        with self.connection.client() as client:
            while not self.stop.is_set():
                self.changed.wait(wait)
                self.changed.clear()
                if self.stop.is_set():
                    break
                if not (self.claims.synced and self.volumes.synced):
                    wait = RETRY_SECONDS
                    continue
                wait = RETRY_SECONDS if not self.reconcile(client) else RESYNC_SECONDS

    def reconcile(self, client: httpx.Client) -> bool:
        """One pass over the whole picture; False if some action failed (retry soon)."""
        volumes = self.volumes.snapshot()  # cluster-scoped: keyed by name
        actions = plan(self.claims.snapshot().values(), volumes, self.root, self.class_name)
        ok = True
        for action in actions:
            what = describe(action)
            try:
                self.execute(client, action)
            except (httpx.HTTPError, ApiError, OSError) as error:
                ok = False
                if (what, str(error)) not in self.reported:
                    self.reported.add((what, str(error)))
                    log(f"failed to {what}: {error}; retrying")
            else:
                self.reported = {entry for entry in self.reported if entry[0] != what}
        return ok

    def execute(self, client: httpx.Client, action: Action) -> None:
        if isinstance(action, Skip):
            if (action.key, action.reason) not in self.reported:
                self.reported.add((action.key, action.reason))
                log(f"skipping {action.key}: {action.reason}")
        elif isinstance(action, Provision):
            self._provision(client, action)
        elif isinstance(action, Delete):
            self._delete(client, action)
        else:
            self._expand(client, action)

    def _provision(self, client: httpx.Client, action: Provision) -> None:
        self._make_directory(action.path)
        response = _check(client.post(self.VOLUMES, json=action.pv), allow=(409,))
        if response.status_code == 409:
            return  # created earlier; the cache had not seen it yet
        self.volumes.put(response.json())
        log(
            f"provisioned {action.pv['metadata']['name']} for {action.claim} on node"
            f" {action.node}: {action.path}"
            f" ({action.pv['spec']['capacity']['storage']})"
        )

    def _make_directory(self, path: Path) -> None:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o777)
        if path.is_symlink() or not path.is_dir():
            raise OSError(f"{path} exists and is not a directory")
        path.chmod(0o777)  # mkdir's mode is masked by the umask

    def _delete(self, client: httpx.Client, action: Delete) -> None:
        path = action.path
        existed = path.exists() or path.is_symlink()
        if os.path.realpath(path) != str(path):
            # A symlink somewhere on the way: never remove what it points to.
            if existed:
                raise OSError(f"refusing to remove {path}: it resolves elsewhere")
        elif existed:
            shutil.rmtree(path)
        if action.deleting:
            if existed:
                log(f"removed {path} of {action.pv}, which is being deleted")
            return
        response = _check(client.delete(f"{self.VOLUMES}/{action.pv}"), allow=(404,))
        if response.status_code != 404:
            log(f"deleted {action.pv} and removed {path}")
        # Until the watch reports it gone, the volume stays in the cache as being deleted.
        body = response.json() if response.status_code == 200 else {}
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            self.volumes.put(body)
        else:
            self.volumes.drop({"metadata": {"name": action.pv}})

    def _expand(self, client: httpx.Client, action: Expand) -> None:
        namespace, name = action.claim.split("/", 1)
        if action.grow_pv:
            patch = {"spec": {"capacity": {"storage": action.size}}}
            response = _check(
                client.patch(
                    f"{self.VOLUMES}/{action.pv}", content=json.dumps(patch), headers=MERGE_PATCH
                )
            )
            self.volumes.put(response.json())
        response = _check(
            client.patch(
                f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}/status",
                content=json.dumps(action.status_patch),
                headers=MERGE_PATCH,
            )
        )
        self.claims.put(response.json())
        log(f"expanded {action.pv} for {action.claim} to {action.size} (a directory: no resize)")


def describe(action: Action) -> str:
    if isinstance(action, Provision):
        return f"provision {action.pv['metadata']['name']} for {action.claim}"
    if isinstance(action, Delete):
        return f"delete {action.pv}"
    if isinstance(action, Expand):
        return f"expand {action.pv} for {action.claim} to {action.size}"
    return f"skip {action.key}"


# --- the command ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m stateward.local.provisioner",
        description="Provision node-local directory volumes for the local cluster.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig to use")
    parser.add_argument(
        "--root", type=Path, required=True, help="volumes live in ROOT/<node>/<pv-name>"
    )
    parser.add_argument(
        "--storage-class", default=STORAGE_CLASS, help=f"class to serve (default {STORAGE_CLASS})"
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def _signals(provisioner: Provisioner) -> Iterator[None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        provisioner.stop.set()
        provisioner.changed.set()  # wake the main loop

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stateward-provisioner-") as scratch:
        try:
            connection = load_kubeconfig(args.kubeconfig, Path(scratch))
        except (OSError, ValueError, KeyError, ssl.SSLError, yaml.YAMLError) as error:
            print(f"cannot use kubeconfig {args.kubeconfig}: {error}", file=sys.stderr)
            return 2
        provisioner = Provisioner(connection, root, args.storage_class)
        with _signals(provisioner):
            provisioner.run()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
