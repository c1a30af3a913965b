"""The certificates phase shared by every engine that serves TLS: the owner's CA, made once,
and the serving and client certificates it signs, (re)issued when ``tls.renewal_reason``
says so. Both decisions read only metadata the store keeps; the CA's key is read (and
dropped) only to issue."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ssl
from typing import Final

from lightkube import ApiError

from stateward import pki, rfc3339
from stateward.controllers import core
from stateward.controllers.kube import Body, Ref
from stateward.specs import tls

CA_ONLY: Final = frozenset({tls.CA_CERT_KEY})
"""What the operator keeps of a Secret that also holds a private key: the CA certificate."""
RECHECK: Final = 2.0
"""A CA Secret made a moment ago by another reconcile: look again this soon."""


async def ensure(scope: core.Scope, cluster: tls.Served) -> str | None:
    """The cluster's CA — its own, made once, or a copy of the user's
    (``spec.tls.caSecretName``) — and the serving certificate it signs, (re)issued when
    ``tls.renewal_reason`` says so: missing, near its end, other names, another CA. Both
    decisions read only metadata the store keeps; the CA's key is read (and dropped) only to
    issue, or to copy the user's CA when that Secret changed."""
    notes: list[str] = []
    authority: pki.Authority | None = None
    ca = scope.observed("Secret", cluster.ca_secret_name)
    if cluster.user_ca_secret_name is not None:
        copied = await _copy_user_ca(scope, cluster, cluster.user_ca_secret_name, ca)
        if copied is None:
            return None
        ca, authority, note = copied
        notes += [note] if note else []
    elif ca is None or tls.ca_source(ca) is not None:
        # None yet, or a copy of a user's CA that spec.tls no longer names: our own.
        replacing = ca is not None
        authority = pki.Authority.new(tls.ca_common_name(cluster))
        body = tls.ca_secret(cluster, cert=authority.cert_pem, key=authority.key_pem)
        try:
            ca = await (scope.kube.apply(body) if replacing else scope.kube.create(body))
        except ApiError as error:
            if error.status.code != 409:
                raise
            scope.requeue(RECHECK)  # made a moment ago: the store sees it shortly
            return None
        scope.store.observe(ca)
        scope.secrets.remember(scope, ca, keys=CA_ONLY)  # as ca_cert reads it
        notes.append(f"{'replaced' if replacing else 'created'} {cluster.ca_secret_name}")
        if replacing:
            await scope.event(
                "CertificateAuthorityReplaced",
                f"spec.tls.caSecretName is unset: Secret {cluster.ca_secret_name} holds a new"
                " CA of the cluster's own; every certificate is reissued with it",
            )
    fingerprint = tls.recorded_ca_fingerprint(ca)
    ca_not_after = tls.recorded_not_after(ca)
    if not fingerprint:  # a CA Secret someone made by hand
        authority = authority or await _authority(scope, cluster)
        if authority is None:
            return None
        fingerprint, ca_not_after = pki.fingerprint(authority.cert_pem), authority.not_after
    now = datetime.datetime.now(datetime.UTC)
    expiring = tls.ca_expiry_problem(cluster.ca_secret_name, ca_not_after, now)
    if expiring is not None:
        await scope.degrade("CertificateAuthorityExpiring", expiring)
    served = scope.observed("Secret", cluster.tls_secret_name)
    user_server: Body | None = None
    if cluster.user_server_secret_name is not None:
        user_server = await _user_secret(
            scope, cluster.user_server_secret_name, **SERVER_SECRET_MISSING
        )
        if user_server is None:  # Degraded says what to fix; the servers keep what they serve
            return "; ".join(notes) or None
    reason = tls.renewal_reason(
        cluster,
        served,
        ca_fingerprint=fingerprint,
        now=now,
        ca_not_after=ca_not_after,
        server=_source(user_server),
    )
    if reason is not None:
        server: tls.ServerCertificate | None = None
        if user_server is not None:
            server = await _user_server(scope, cluster, user_server, now)
            if server is None:
                return "; ".join(notes) or None
        authority = authority or await _authority(scope, cluster)
        if authority is None:
            return None
        validity = tls.validity_under(authority.not_after, now)
        # Each certificate file carries the chain up to the root (a user's intermediate CA):
        # clients that trust only their organisation's root verify the servers too.
        chain = authority.intermediates_pem
        if server is None:
            issued = authority.issue(
                common_name=f"{cluster.primary_service_name}.{cluster.namespace}.svc",
                hosts=tls.server_names(cluster),
                server=True,
                validity=validity,
            )
            cert, key = issued.cert + chain, issued.key
        else:
            cert, key = server.chain, server.key
        clients = {
            stem: (client.cert + chain, client.key)
            for stem, user in tls.clients_of(cluster).items()
            for client in (authority.issue(common_name=user, validity=validity),)
        }
        secret = tls.server_secret(
            cluster,
            cert=cert,
            key=key,
            ca_cert=authority.trusted_pem,
            clients=clients,
            server=server,
        )
        until = rfc3339.format(pki.not_after(cert))
        what = (
            "Issued the serving certificate"
            if server is None
            else f"Serving the certificate of Secret {cluster.user_server_secret_name}"
            " (spec.tls.serverSecretName) from"
        )
        message = f"{what} Secret {cluster.tls_secret_name} ({reason}); valid until {until}" + (
            "" if served is None else "; the instances reload it without a restart"
        )
        if server is None and served is None:
            # The first: nothing runs that could read it yet. The Secrets are made meanwhile,
            # and the children wait for it (Scope.defer).
            scope.defer(_serve(scope, secret, message))
        else:
            served = await _serve(scope, secret, message)
        notes.append(f"issued {cluster.tls_secret_name}")
    if cluster.user_server_secret_name is not None:
        expiring = tls.server_expiry_problem(cluster.user_server_secret_name, served, now)
        if expiring is not None:
            await scope.degrade("ServerCertificateExpiring", expiring)
    return "; ".join(notes) or None


async def _serve(scope: core.Scope, secret: Body, message: str) -> Body:
    """Write the serving certificate's Secret and say so in an Event."""
    applied = await scope.kube.apply(secret)
    scope.store.observe(applied)
    scope.secrets.remember(scope, applied, keys=CA_ONLY)  # as the REST API's clients read it
    await scope.event("CertificateIssued", message)
    return applied


SERVER_SECRET_MISSING: Final = {
    "field": "spec.tls.serverSecretName",
    "reason": "ServerCertificateMissing",
    "fix": "create it (tls.crt, tls.key and ca.crt, e.g. from a cert-manager Certificate)"
    " or unset it; the servers keep their current certificates",
}


def _source(secret: Body | None) -> str | None:
    """A user's Secret as the copies record it: ``NAME/resourceVersion``."""
    if secret is None:
        return None
    metadata = secret["metadata"]
    return f"{metadata['name']}/{metadata.get('resourceVersion', '')}"


def _decoded(secret: Body) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value)
        except ValueError:
            continue
    return data


async def _user_secret(
    scope: core.Scope, name: str, *, field: str, reason: str, fix: str
) -> Body | None:
    """The user's Secret ``name`` (one GET per reconcile: it is not watched), or None with
    Degraded naming ``field`` and the ``fix`` while it does not exist."""
    found = await scope.kube.get("v1", "Secret", scope.namespace, name)
    if found is None:
        scope.requeue(USER_CA_RECHECK)
        await scope.degrade(
            reason,
            f"{field} names Secret {name}, which does not exist in namespace"
            f" {scope.namespace}: {fix}",
        )
    return found


async def _user_server(
    scope: core.Scope, cluster: tls.Served, secret: Body, now: datetime.datetime
) -> tls.ServerCertificate | None:
    """The user's serving certificate, checked (``tls.user_server``); None, with Degraded
    saying what is wrong, when it cannot be served."""
    name = secret["metadata"]["name"]
    try:
        return tls.user_server(cluster, _decoded(secret), source=_source(secret) or "", now=now)
    except ValueError as problem:  # says what is wrong, never quoting the data
        scope.requeue(USER_CA_RECHECK)
        await scope.degrade(
            "ServerCertificateInvalid",
            f"Secret {name} (spec.tls.serverSecretName) cannot be served: {problem}. Fix the"
            " Secret or unset serverSecretName; the servers keep their current certificates",
        )
        return None


USER_CA_RECHECK: Final = 30.0
"""While the user's CA Secret is missing or unusable: look again this soon (it is not
watched; once usable, the resync interval picks up its renewals)."""


async def _copy_user_ca(
    scope: core.Scope, cluster: tls.Served, name: str, ca: Body | None
) -> tuple[Body, pki.Authority | None, str | None] | None:
    """``NAME-ca`` as a copy of the user's CA Secret ``name``, copied again when that Secret
    changed (its resourceVersion; one GET per reconcile). Returns the CA Secret, the CA when
    it was just loaded (None when the copy was current), and a note. None, with Degraded
    saying what to fix, while the Secret is missing or holds no usable CA: the servers keep
    the certificates they have."""
    field = "spec.tls.caSecretName"
    found = await _user_secret(
        scope,
        name,
        field=field,
        reason="CertificateAuthorityMissing",
        fix="create it (a CA's tls.crt and tls.key, e.g. from a cert-manager Certificate with"
        " isCA: true) or unset it; the servers keep their current certificates",
    )
    if found is None:
        return None
    source = _source(found)
    if ca is not None and tls.ca_source(ca) == source:
        return ca, None, None
    try:
        chain, key = tls.user_ca(_decoded(found))
        authority = pki.Authority.load(chain, key)
    except ValueError as problem:  # says what is wrong, never quoting the data
        scope.requeue(USER_CA_RECHECK)
        await scope.degrade(
            "CertificateAuthorityInvalid",
            f"Secret {name} ({field}) holds no usable CA: {problem}. Put a CA certificate"
            " (basicConstraints CA:TRUE) and its unencrypted RSA or EC key in tls.crt and"
            " tls.key (or ca.crt and ca.key); the servers keep their current certificates",
        )
        return None
    copied = await scope.kube.apply(
        tls.ca_secret(cluster, cert=chain, key=key, source=source or "")
    )
    scope.store.observe(copied)
    await scope.event(
        "CertificateAuthorityCopied",
        f"Copied the CA of Secret {name} ({field}) into {cluster.ca_secret_name};"
        " certificates it did not sign are reissued",
    )
    return copied, authority, f"copied {name} into {cluster.ca_secret_name}"


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
            f"Secret {name} holds no usable CA ({tls.CA_CERT_KEY} and its {tls.CA_KEY_KEY},"
            " PEM); delete it and Stateward makes a new one (or copies spec.tls.caSecretName"
            " again) and reissues the certificates"
        )
        await scope.degrade("CertificateAuthorityInvalid", message)
        return None


async def ca_cert(scope: core.Scope, cluster: tls.Served) -> str | None:
    """What applications trust to verify the servers (PEM): the CA's certificate, from
    ``NAME-ca`` without its key; while the user's own serving certificate is asked for,
    ``NAME-tls``'s ``ca.crt`` (its root beside the CA: what the servers serve verifies,
    whichever it is yet)."""
    name = cluster.ca_secret_name
    if cluster.user_server_secret_name is not None:
        name = cluster.tls_secret_name
    data = await scope.secrets.read(scope, name, keys=CA_ONLY)
    return (data or {}).get(tls.CA_CERT_KEY) or None


async def refresh_ca_copy(scope: core.Scope, cluster: tls.Served, name: str, ca_pem: str) -> None:
    """The Secret ``name`` (the app Secret) carries the current CA in ``ca.crt`` (a new CA,
    or a Secret made before TLS): only that key and its annotation change, never a password
    or a URL. The CA Secret's recorded fingerprint says whether, without parsing it."""
    observed = scope.observed("Secret", name)
    if observed is None:
        return
    if cluster.user_server_secret_name is not None:  # a bundle of two roots: all of it counts
        fingerprint = hashlib.sha256(ca_pem.encode()).hexdigest()
    else:
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


CONSOLE_VALIDITY: Final = datetime.timedelta(hours=1)


async def console_context(
    scope: core.Scope, cluster: tls.Served, user: str
) -> ssl.SSLContext | None:
    """A TLS client context for PgBouncer's admin console as ``user``: a certificate the
    cluster's CA issues now (valid an hour, held in memory, never stored), verifying the
    pooler's serving chain against ``NAME-tls``'s ``ca.crt`` (pooler pods are addressed by
    IP: the chain, not the name). None while the CA or that Secret is not usable."""
    served = await scope.secrets.read(scope, cluster.tls_secret_name, keys=CA_ONLY)
    trusted = (served or {}).get(tls.CA_CERT_KEY)
    if not trusted:
        return None
    authority = await _authority(scope, cluster)
    if authority is None:
        return None
    issued = authority.issue(common_name=user, validity=CONSOLE_VALIDITY)
    return pki.client_context(ca=trusted.encode(), cert=issued.cert, key=issued.key)
