"""Simulations for kwok-only clusters, which only tests and benchmarks may use.

On kwok's simulated nodes no process runs, so nothing labels a database pod's role and every
Job pod completes. The control-plane tests (and the benchmark's thousand clusters) need both
to behave as the real data plane would; these stages stand in, passed to the local cluster as
``Config(kwok_stages=simulate)``. The product never loads them: on real nodes Patroni labels
the roles and Jobs run for real.
"""

from __future__ import annotations

import yaml

SIMULATED_FAILURE_SUFFIX = ":simulate-failure"
"""Job pods whose image ends in this fail instead of completing."""
ROLE_LABEL = "stateward.io/role"


def simulate(stages: str) -> str:
    """The product's kwok stages plus ours.

    * Job pods whose image ends in ``:simulate-failure`` fail instead of completing: the
      stand-in for a backup that breaks, so failure handling can be exercised.
    * A PostgreSQL pod with no role yet gets one, as Patroni would label it after bootstrap:
      ordinal 0 ``primary``, the others ``replica``. Pods that already carry a role keep it.
      (MySQL and MariaDB pods get none: their roles come from the operator over SQL, which
      no simulated pod answers.)
    """
    documents = [d for d in yaml.safe_load_all(stages) if d]
    not_simulated_failure = {
        "cel": {
            "expression": "!self.spec.containers.exists(c, c.image.endsWith("
            f"'{SIMULATED_FAILURE_SUFFIX}'))"
        }
    }
    for document in documents:
        if document["metadata"]["name"] == "pod-complete":
            document["spec"]["selector"]["matchExpressions"].append(not_simulated_failure)
    extra = [yaml.safe_load(text) for text in (POD_FAIL_STAGE, POD_ROLE_STAGE)]
    return yaml.safe_dump_all([*documents, *extra], sort_keys=False)


POD_FAIL_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: stateward-pod-fail
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
    - cel:
        expression: >-
          self.spec.containers.exists(c, c.image.endsWith('{SIMULATED_FAILURE_SUFFIX}'))
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 1
            finishedAt: {{{{ $now | Quote }}}}
            reason: Error
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: Failed
"""

POD_ROLE_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: stateward-simulated-patroni-role
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - cel:
        expression: >-
          has(self.metadata.labels) &&
          'stateward.io/cluster' in self.metadata.labels &&
          self.metadata.labels['app.kubernetes.io/name'] == 'postgresql' &&
          'statefulset.kubernetes.io/pod-name' in self.metadata.labels &&
          !('{ROLE_LABEL}' in self.metadata.labels)
  next:
    patches:
    - root: metadata
      template: |
        labels:
          {ROLE_LABEL}: {{{{ if hasSuffix "-0" .metadata.name }}}}primary{{{{ else -}}}}
            replica{{{{- end }}}}
"""
