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

It is level-triggered: it lists and watches claims and volumes through lightkube, the client
the operator uses (re-listing on any error or ``410 Gone``), decides from the whole picture
what to do (``plan``, a pure function) at every change and every ``RESYNC_SECONDS``, and
does it idempotently, logging one line per action.

Run it as ``python -m stateward_local.services.provisioner --kubeconfig PATH --root DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

import httpx2
import yaml
from lightkube import ApiError, Client, ConfigError, KubeConfig, codecs
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim
from lightkube.types import PatchType
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


def connect(kubeconfig: Path) -> Callable[[], Client]:
    """A factory of clients of the kubeconfig's current context (one per thread: the watches
    and the actions each hold their own connection). Raises on an unusable kubeconfig."""
    config = KubeConfig.from_file(kubeconfig)
    config.get()  # the current context exists, or ConfigError now rather than in a thread
    return lambda: Client(config, field_manager="stateward-provisioner")


def _to_dict(obj: Any) -> Object:
    result: Object = obj.to_dict()
    return result


def _missing(error: ApiError) -> bool:
    return error.status.code == 404


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
    """List, then watch from the list's resourceVersion (lightkube renews the watch when the
    server ends it after ``RESYNC_SECONDS``); list again when the watch fails or reports
    ``410 Gone``."""

    def __init__(
        self,
        client: Client,
        resource: type[PersistentVolumeClaim] | type[PersistentVolume],
        cache: Cache,
        changed: threading.Event,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"watch {resource.__name__}", daemon=True)
        self.client, self.resource, self.cache = client, resource, cache
        self.changed, self.stop = changed, stop
        self.scope: dict[str, str] = (
            {"namespace": "*"} if resource is PersistentVolumeClaim else {}
        )  # every namespace's claims

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                self._list_and_watch()
                failures = 0
            except (httpx2.HTTPError, ApiError, ValueError, OSError) as error:
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log(f"watch {self.resource.__name__} failed ({error}); re-listing")
                self.stop.wait(min(failures, 5))

    def _list_and_watch(self) -> None:
        listed = self.client.list(self.resource, **self.scope)  # type: ignore[call-overload]
        self.cache.replace([_to_dict(item) for item in listed])
        self.changed.set()
        events = self.client.watch(  # type: ignore[call-overload]
            self.resource,
            **self.scope,
            resource_version=listed.resourceVersion,
            server_timeout=int(RESYNC_SECONDS),
        )
        for kind, obj in events:
            if self.stop.is_set():
                return
            if kind in ("ADDED", "MODIFIED"):
                self.cache.put(_to_dict(obj))
            elif kind == "DELETED":
                self.cache.drop(_to_dict(obj))
            else:
                continue  # BOOKMARK
            self.changed.set()


class Provisioner:
    """Runs ``plan`` against the cluster whenever claims or volumes change."""

    def __init__(self, connect: Callable[[], Client], root: Path, class_name: str) -> None:
        self.connect = connect
        self.client = connect()
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
            Watcher(self.connect(), PersistentVolumeClaim, self.claims, self.changed, self.stop),
            Watcher(self.connect(), PersistentVolume, self.volumes, self.changed, self.stop),
        ]
        for watcher in watchers:
            watcher.start()
        log(f"serving storage class {self.class_name} ({PROVISIONER}) under {self.root}")
        wait = RESYNC_SECONDS
        while not self.stop.is_set():
            self.changed.wait(wait)
            self.changed.clear()
            if self.stop.is_set():
                break
            if not (self.claims.synced and self.volumes.synced):
                wait = RETRY_SECONDS
                continue
            wait = RETRY_SECONDS if not self.reconcile() else RESYNC_SECONDS

    def reconcile(self) -> bool:
        """One pass over the whole picture; False if some action failed (retry soon)."""
        volumes = self.volumes.snapshot()  # cluster-scoped: keyed by name
        actions = plan(self.claims.snapshot().values(), volumes, self.root, self.class_name)
        ok = True
        for action in actions:
            what = describe(action)
            try:
                self.execute(action)
            except (httpx2.HTTPError, ApiError, OSError) as error:
                ok = False
                if (what, str(error)) not in self.reported:
                    self.reported.add((what, str(error)))
                    log(f"failed to {what}: {error}; retrying")
            else:
                self.reported = {entry for entry in self.reported if entry[0] != what}
        return ok

    def execute(self, action: Action) -> None:
        if isinstance(action, Skip):
            if (action.key, action.reason) not in self.reported:
                self.reported.add((action.key, action.reason))
                log(f"skipping {action.key}: {action.reason}")
        elif isinstance(action, Provision):
            self._provision(action)
        elif isinstance(action, Delete):
            self._delete(action)
        else:
            self._expand(action)

    def _provision(self, action: Provision) -> None:
        self._make_directory(action.path)
        try:
            created = self.client.create(codecs.from_dict(action.pv))
        except ApiError as error:
            if error.status.code == 409:
                return  # created earlier; the cache had not seen it yet
            raise
        self.volumes.put(_to_dict(created))
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

    def _delete(self, action: Delete) -> None:
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
        try:
            self.client.delete(PersistentVolume, action.pv)
        except ApiError as error:
            if not _missing(error):
                raise
            self.volumes.drop({"metadata": {"name": action.pv}})
            return
        log(f"deleted {action.pv} and removed {path}")
        # Until the watch reports it gone (its protection finalizer may hold it a moment),
        # the volume stays in the cache as being deleted: nothing deletes it twice.
        cached = self.volumes.snapshot().get(action.pv)
        if cached is not None:
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            metadata = {**cached["metadata"], "deletionTimestamp": stamp}
            self.volumes.put({**cached, "metadata": metadata})

    def _expand(self, action: Expand) -> None:
        namespace, name = action.claim.split("/", 1)
        if action.grow_pv:
            patch = {"spec": {"capacity": {"storage": action.size}}}
            grown = self.client.patch(
                PersistentVolume, action.pv, patch, patch_type=PatchType.MERGE
            )
            self.volumes.put(_to_dict(grown))
        claim = self.client.patch(
            PersistentVolumeClaim.Status,
            name,
            action.status_patch,
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        self.claims.put(_to_dict(claim))
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
        prog="python -m stateward_local.services.provisioner",
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
    try:
        clients = connect(args.kubeconfig)
        provisioner = Provisioner(clients, root, args.storage_class)
    except (OSError, ValueError, KeyError, ConfigError, yaml.YAMLError) as error:
        print(f"cannot use kubeconfig {args.kubeconfig}: {error}", file=sys.stderr)
        return 2
    with _signals(provisioner):
        provisioner.run()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
