"""NetworkPolicy enforcement for the local cluster's real nodes (ingress rules).

The nodes' CNI (``ptp``) gives each pod a veth into its node's network namespace and a route
there, so every packet to a pod — from a pod on the same node, from another node, from the
host — is forwarded by that node's namespace. This host process lists pods, namespaces and
NetworkPolicies once a second and keeps, in each real node's namespace, an nftables table
``stateward-policy`` whose forward chain admits to each local pod that a policy selects only
what its ingress rules allow. Packets of connections already admitted always pass, and so do
the host's and the nodes' bridge addresses: the operator, the tests and the API server run
on the host, and kube-proxy masquerades what comes from outside the cluster to a Service as
the node it enters by — the host-network traffic policy-enforcing CNIs let through too.
Pods no policy selects are left alone, as the NetworkPolicy API says.

Not the product: the operator only ships NetworkPolicies; this makes the local cluster honour
them, as a policy-enforcing CNI would. Egress rules are not enforced (Stateward ships none).
``local up`` starts it with real nodes (``netpol`` among the cluster's processes). A new
pod's address is admitted at the next round, a second or more after the pod gets it: a SYN it
sends to a guarded pod before then is dropped, and the kernel sends it again. What a new pod
does first must therefore retry: Patroni's base backup does, and a MariaDB server whose
Database has data waits for its primary (it never initializes an empty data directory).

Run by hand:
``python -m stateward_local.services.netpol --kubeconfig PATH --state-dir DIR --nodes N``
(``--namespace NS``, repeatable: guard only those namespaces' pods); it removes its tables
when it stops.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.networking_v1 import NetworkPolicy

from stateward_local.nodes import host, layout

TABLE = "stateward-policy"
INTERVAL = 1.0
Object = Mapping[str, Any]


def _matches(selector: Object | None, labels: Mapping[str, str]) -> bool:
    """A label selector's verdict (an empty selector selects everything)."""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator = requirement["key"], requirement["operator"]
        values = set(requirement.get("values") or ())
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _labels(obj: Object) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _peer_sources(
    peer: Object, namespace: str, pods: Sequence[Object], namespaces: Sequence[Object]
) -> list[str]:
    """The source matches of one ``from`` entry, as nftables expressions."""
    block = peer.get("ipBlock")
    if block is not None:
        excepted = block.get("except") or []
        rule = f"ip saddr {block['cidr']}"
        if excepted:
            rule += f" ip saddr != {{ {', '.join(excepted)} }}"
        return [rule]
    if "namespaceSelector" in peer:
        chosen = {
            (n.get("metadata") or {}).get("name")
            for n in namespaces
            if _matches(peer["namespaceSelector"], _labels(n))
        }
    else:
        chosen = {namespace}
    selector = peer.get("podSelector")
    addresses = sorted(
        {
            str(p["status"]["podIP"])
            for p in pods
            if (p.get("metadata") or {}).get("namespace") in chosen
            and (p.get("status") or {}).get("podIP")
            and _matches(selector, _labels(p))
        }
    )
    return [f"ip saddr {{ {', '.join(addresses)} }}"] if addresses else []


def _ports(rule: Object) -> list[str]:
    """The destination matches of one ingress rule's ports (empty: every port)."""
    matches = []
    for port in rule.get("ports") or []:
        protocol = str(port.get("protocol") or "TCP").lower()
        number = port.get("port")
        if number is None:
            matches.append(f"meta l4proto {protocol}")
        elif isinstance(number, int):
            end = port.get("endPort")
            span = f"{number}-{end}" if end else str(number)
            matches.append(f"{protocol} dport {span}")
        # A named port would need the pod's container ports: Stateward uses none.
    return matches or [""]


def ruleset(
    local_pods: Sequence[Object],
    pods: Sequence[Object],
    namespaces: Sequence[Object],
    policies: Sequence[Object],
    *,
    always: Iterable[str],
) -> str:
    """The nftables script for one node: ``local_pods`` are the pods it forwards to."""
    lines = [
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        "    ct state established,related accept",
    ]
    trusted = ", ".join(always)
    if trusted:
        lines.append(f"    ip saddr {{ {trusted} }} accept")
    for pod in sorted(local_pods, key=lambda p: str(p["status"]["podIP"])):
        namespace = pod["metadata"]["namespace"]
        selecting = [
            policy
            for policy in policies
            if policy["metadata"]["namespace"] == namespace
            and _matches((policy.get("spec") or {}).get("podSelector") or {}, _labels(pod))
            and "Ingress" in _policy_types(policy)
        ]
        if not selecting:
            continue
        address = pod["status"]["podIP"]
        for policy in selecting:
            for rule in (policy.get("spec") or {}).get("ingress") or []:
                peers = rule.get("from")
                sources = (
                    [""]
                    if not peers
                    else [
                        match
                        for peer in peers
                        for match in _peer_sources(peer, namespace, pods, namespaces)
                    ]
                )
                for source in sources:
                    for port in _ports(rule):
                        match = " ".join(
                            part for part in (f"ip daddr {address}", source, port) if part
                        )
                        lines.append(f"    {match} accept")
        lines.append(f"    ip daddr {address} drop")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _policy_types(policy: Object) -> list[str]:
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes")
    if types:
        return list(types)
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def _in_network(address: str, network: str) -> bool:
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(network)
    except ValueError:
        return False


def scripts(
    node_names: Sequence[str],
    pods: Sequence[Object],
    namespaces: Sequence[Object],
    policies: Sequence[Object],
    *,
    only: Iterable[str] = (),
    slot: layout.Slot | None = None,
) -> dict[str, str]:
    """Each real node's script, from the whole picture; with ``only``, the pods of those
    namespaces are the only ones guarded. The nodes' own network (their ``slot``'s, the
    default slot's unless given) always passes: kubelet probes come from it."""
    always = (str((slot or layout.Slot()).network),)
    guarded = set(only)
    running = [
        p
        for p in pods
        if (p.get("status") or {}).get("podIP") and not (p.get("spec") or {}).get("hostNetwork")
    ]
    return {
        name: ruleset(
            [
                p
                for p in running
                if (p.get("spec") or {}).get("nodeName") == name
                and (not guarded or p["metadata"].get("namespace") in guarded)
            ],
            running,
            namespaces,
            policies,
            always=always,
        )
        for name in node_names
    }


def _dicts(client: Client, resource: Any) -> list[dict[str, Any]]:
    return [item.to_dict() for item in client.list(resource, namespace="*")]


def _nft(node: layout.Node, script: str) -> None:
    host.run(["nsenter", f"--net={node.net_ns}", "nft", "-f", "-"], input=script)


def run(
    kubeconfig: str,
    state_dir: str,
    count: int,
    stop: threading.Event,
    *,
    slot: layout.Slot,
    only: Sequence[str] = (),
) -> None:
    """Until ``stop``: keep every node's table as the policies say; then remove the tables."""
    client = Client(KubeConfig.from_file(kubeconfig))
    real = {node.name: node for node in layout.nodes_in(Path(state_dir), count, slot)}
    applied: dict[str, tuple[int, str]] = {}
    try:
        while not stop.is_set():
            _round(client, real, applied, only, slot)
            stop.wait(INTERVAL)
    finally:
        for name in applied:
            try:
                _nft(real[name], f"table inet {TABLE}\ndelete table inet {TABLE}\n")
            except Exception as error:
                print(f"netpol: {name}: {error}", file=sys.stderr, flush=True)


def _round(
    client: Client,
    real: Mapping[str, layout.Node],
    applied: dict[str, tuple[int, str]],
    only: Sequence[str],
    slot: layout.Slot,
) -> None:
    try:
        wanted = scripts(
            sorted(real),
            _dicts(client, Pod),
            [item.to_dict() for item in client.list(Namespace)],
            _dicts(client, NetworkPolicy),
            only=only,
            slot=slot,
        )
    except Exception as error:  # the API server restarting: try again
        print(f"netpol: listing failed: {error}", file=sys.stderr, flush=True)
        return
    for name, script in wanted.items():
        try:
            # A node stopped and started again has a new namespace, without the table.
            namespace = real[name].net_ns.stat().st_ino
        except OSError:  # the node is stopped
            continue
        if applied.get(name) == (namespace, script):
            continue
        try:
            _nft(real[name], script)
        except Exception as error:  # a node stopped: next round
            print(f"netpol: {name}: {error}", file=sys.stderr, flush=True)
            continue
        applied[name] = (namespace, script)
        print(f"netpol: {name}: {script.count(' drop')} pods guarded", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateward_local.services.netpol")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--slot", type=int, default=0, help="the host slot of the nodes")
    parser.add_argument(
        "--namespace", action="append", default=[], help="guard only these namespaces' pods"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    run(
        args.kubeconfig,
        args.state_dir,
        args.nodes,
        stop,
        slot=layout.Slot(args.slot),
        only=args.namespace,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
