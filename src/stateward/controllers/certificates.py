"""The certificates phase shared by every engine that serves TLS: the owner's CA, made once,
and the serving and client certificates it signs, (re)issued when ``tls.renewal_reason``
says so. Both decisions read only metadata the store keeps; the CA's key is read (and
dropped) only to issue."""

from __future__ import annotations

import base64
import datetime
from typing import Final

from lightkube import ApiError

from stateward import pki
from stateward.controllers import core
from stateward.controllers.kube import Ref
from stateward.specs import tls

RECHECK: Final = 2.0
"""A CA Secret made a moment ago by another reconcile: look again this soon."""


async def ensure(scope: core.Scope, cluster: tls.Served) -> str | None:
    """The cluster's CA, made once, and the serving certificate it signs, (re)issued when
    ``tls.renewal_reason`` says so: missing, near its end, other names, another CA. Both
    decisions read only metadata the store keeps; the CA's key is read (and dropped) only to
    issue."""
    notes: list[str] = []
    authority: pki.Authority | None = None
    ca = scope.observed("Secret", cluster.ca_secret_name)
    if ca is None:
        authority = pki.Authority.new(tls.ca_common_name(cluster))
        try:
            ca = await scope.kube.create(
                tls.ca_secret(cluster, cert=authority.cert_pem, key=authority.key_pem)
            )
        except ApiError as error:
            if error.status.code != 409:
                raise
            scope.requeue(RECHECK)  # made a moment ago: the store sees it shortly
            return None
        scope.store.observe(ca)
        notes.append(f"created {cluster.ca_secret_name}")
    fingerprint = tls.recorded_ca_fingerprint(ca)
    if not fingerprint:  # a CA Secret someone made by hand
        authority = authority or await _authority(scope, cluster)
        if authority is None:
            return None
        fingerprint = pki.fingerprint(authority.cert_pem)
    served = scope.observed("Secret", cluster.tls_secret_name)
    reason = tls.renewal_reason(
        cluster, served, ca_fingerprint=fingerprint, now=datetime.datetime.now(datetime.UTC)
    )
    if reason is not None:
        authority = authority or await _authority(scope, cluster)
        if authority is None:
            return None
        issued = authority.issue(
            common_name=f"{cluster.primary_service_name}.{cluster.namespace}.svc",
            hosts=tls.server_names(cluster),
            server=True,
        )
        clients = {
            stem: (client.cert, client.key)
            for stem, user in tls.clients_of(cluster).items()
            for client in (authority.issue(common_name=user),)
        }
        applied = await scope.kube.apply(
            tls.server_secret(
                cluster,
                cert=issued.cert,
                key=issued.key,
                ca_cert=authority.cert_pem,
                clients=clients,
            )
        )
        scope.store.observe(applied)
        until = pki.not_after(issued.cert).strftime("%Y-%m-%dT%H:%M:%SZ")
        await scope.event(
            "CertificateIssued",
            f"Issued the serving certificate in Secret {cluster.tls_secret_name} ({reason});"
            f" valid until {until}"
            + ("" if served is None else "; the instances reload it without a restart"),
        )
        notes.append(f"issued {cluster.tls_secret_name}")
    return "; ".join(notes) or None


async def _authority(scope: core.Scope, cluster: tls.Served) -> pki.Authority | None:
    """The cluster's CA with its key, read for one issue and not kept; None (and Degraded)
    when the Secret does not hold a usable CA."""
    name = cluster.ca_secret_name
    found = await scope.kube.get("v1", "Secret", scope.namespace, name)
    data = (found or {}).get("data") or {}
    try:
        return pki.Authority.load(
            base64.b64decode(data[tls.CA_CERT_KEY]), base64.b64decode(data[tls.CA_KEY_KEY])
        )
    except (KeyError, ValueError, TypeError):
        message = (
            f"Secret {name} holds no usable CA ({tls.CA_CERT_KEY} and an EC {tls.CA_KEY_KEY},"
            " PEM); delete it and Stateward makes a new one and reissues the certificate"
        )
        await scope.degrade("CertificateAuthorityInvalid", message)
        return None


async def ca_cert(scope: core.Scope, cluster: tls.Served) -> str | None:
    """The CA's certificate (PEM), from ``NAME-ca`` without its key."""
    data = await scope.secrets.read(
        scope, cluster.ca_secret_name, keys=frozenset({tls.CA_CERT_KEY})
    )
    return (data or {}).get(tls.CA_CERT_KEY) or None


async def refresh_ca_copy(scope: core.Scope, cluster: tls.Served, name: str, ca_pem: str) -> None:
    """The Secret ``name`` (the app Secret) carries the current CA in ``ca.crt`` (a new CA,
    or a Secret made before TLS): only that key and its annotation change, never a password
    or a URL. The CA Secret's recorded fingerprint says whether, without parsing it."""
    observed = scope.observed("Secret", name)
    if observed is None:
        return
    fingerprint = tls.recorded_ca_fingerprint(
        scope.observed("Secret", cluster.ca_secret_name)
    ) or pki.fingerprint(ca_pem.encode())  # parsed only for a CA Secret made by hand
    if tls.recorded_ca_fingerprint(observed) == fingerprint:
        return
    patched = await scope.kube.patch(
        Ref("v1", "Secret", scope.namespace, name),
        {
            "metadata": {"annotations": {tls.CA_FINGERPRINT_ANNOTATION: fingerprint}},
            "data": {tls.CA_CERT_KEY: base64.b64encode(ca_pem.encode()).decode("ascii")},
        },
    )
    scope.store.observe(patched)
