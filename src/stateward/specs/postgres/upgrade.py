"""The major upgrade's Job: ``stateward-instance upgrade`` on the first instance's volume.

It runs once every instance pod is gone (the primary, moved to ordinal 0 first, shut down
cleanly last), in the new major's image, as the instances' user, with nothing but the data
volume and a ``/tmp``: no credentials, no service-account token, no network it needs. The
volume's node affinity places it where the volume is. A refusal (exit 3) is final: the Job
does not retry what ``pg_upgrade --check`` found; anything else may be retried, as every
step of the command is safe to repeat.
"""

from __future__ import annotations

from typing import Final

from stateward.api import v1alpha1
from stateward.instance import patroni, upgrade
from stateward.specs import meta, pods
from stateward.specs.postgres import statefulset

COMPONENT: Final = "upgrade"
CONTAINER_NAME: Final = "upgrade"
DATA_VOLUME: Final = "pgdata"
TMP_VOLUME: Final = "tmp"
DEADLINE_SECONDS: Final = 3600
"""pg_upgrade --link takes seconds to minutes (the catalog, not the data); an hour means
something is wrong, and the operator says so."""


def data_claim_name(cluster: v1alpha1.PostgresCluster, ordinal: int = 0) -> str:
    """The data volume claim of instance ``ordinal`` (the StatefulSet's claim template)."""
    return f"{statefulset.DATA_VOLUME}-{cluster.name}-{ordinal}"


def upgrade_job(
    cluster: v1alpha1.PostgresCluster, *, old_major: int, new_major: int, image: str
) -> meta.Object:
    """``NAME-upgrade``: ``pg_upgrade`` from ``old_major`` to ``new_major`` in ``image`` on
    the first instance's volume."""
    container: meta.Object = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": [
            "stateward-instance",
            "upgrade",
            f"--from={old_major}",
            f"--to={new_major}",
            f"--data-dir={patroni.DATA_DIR}",
        ],
        "env": [{"name": "LANG", "value": "C.UTF-8"}],
        "volumeMounts": [
            {"name": DATA_VOLUME, "mountPath": patroni.DATA_MOUNT},
            {"name": TMP_VOLUME, "mountPath": patroni.TMP_DIR},
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        # The outcome, one line, which the operator reads into status.upgrade.message.
        "terminationMessagePolicy": "File",
        "securityContext": pods.container_security_context(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta.object_meta(cluster, cluster.upgrade_job_name, component=COMPONENT),
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER_NAME,
                            "operator": "In",
                            "values": [upgrade.REFUSED],
                        },
                    }
                ]
            },
            "template": {
                "metadata": {"labels": meta.labels(cluster, component=COMPONENT)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pods.pod_security_context(),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": DATA_VOLUME,
                            "persistentVolumeClaim": {"claimName": data_claim_name(cluster)},
                        },
                        pods.empty_dir(TMP_VOLUME),
                    ],
                },
            },
        },
    }
