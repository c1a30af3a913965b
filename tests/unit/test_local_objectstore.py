"""The local object store's objects and command line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stateward.api import manifests
from stateward_local.nodes import layout
from stateward_local.services import objectstore

pytestmark = pytest.mark.unit
SLOT = layout.Slot(1)


def test_pods_reach_the_host_through_a_service_with_a_fixed_endpoint() -> None:
    service, endpoints = objectstore.service(), objectstore.endpoint_slice(SLOT)
    assert "selector" not in service["spec"]
    assert service["spec"]["ports"][0]["port"] == 443
    assert (
        endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == service["metadata"]["name"]
    )
    # Not the EndpointSlice controller's: it would remove it from a selector-less Service.
    assert endpoints["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] != (
        "endpointslice-controller.k8s.io"
    )
    # Label values: no slashes (the API server refused "stateward.io/local").
    for value in endpoints["metadata"]["labels"].values():
        assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value), value
    assert endpoints["endpoints"][0]["addresses"] == [SLOT.host_ip]
    assert endpoints["ports"][0]["port"] == objectstore.PORT


def test_the_certificate_names_what_pods_connect_to() -> None:
    assert objectstore.endpoint() == "stateward-objectstore.kube-system.svc"
    assert objectstore.endpoint() in objectstore.certificate_hosts(SLOT)


def test_credentials_stay_off_the_command_line(tmp_path: Path) -> None:
    credentials = objectstore.Credentials.generate()
    argv = objectstore.argv(
        Path("/bin/versitygw"), root=tmp_path, cert=Path("c"), key=Path("k"), slot=SLOT
    )
    assert credentials.secret_access_key not in " ".join(argv)
    assert argv[-2:] == ["posix", str(tmp_path)]
    assert f"{SLOT.host_ip}:{objectstore.PORT}" in argv
    assert credentials.secret_access_key not in repr(credentials)
    assert set(credentials.environment()) == {"ROOT_ACCESS_KEY_ID", "ROOT_SECRET_ACCESS_KEY"}


def test_credentials_round_trip_privately(tmp_path: Path) -> None:
    credentials = objectstore.Credentials.generate()
    path = tmp_path / "store" / "credentials.json"
    credentials.save(path)
    assert path.stat().st_mode & 0o077 == 0
    assert objectstore.Credentials.load(path) == credentials
    assert objectstore.Credentials.generate() != credentials


def test_the_secret_has_what_a_repository_names() -> None:
    credentials = objectstore.Credentials("AK", "SK")
    secret = objectstore.secret(credentials, ca_pem="PEM")
    assert secret["stringData"] == {"accessKeyId": "AK", "secretAccessKey": "SK", "ca.crt": "PEM"}


def test_the_sample_cluster_backs_up_to_the_local_store() -> None:
    import yaml

    sample = yaml.safe_load(manifests.sample_yaml())
    s3 = sample["spec"]["backup"]["repository"]["s3"]
    expected = objectstore.repository("/ignored")["s3"]
    del expected["path"], expected["region"]
    assert s3 == expected
