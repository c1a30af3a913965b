"""The operator's log stays readable: the HTTP clients' per-request INFO lines are quieted, and
an outage is told apart from a refusal."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx2
import pytest
from lightkube import ApiError, Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Namespace

from stateward.controllers import kube
from stateward.runtime import operator

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_levels() -> Iterator[None]:
    names = [*operator.CHATTY_LOGGERS, "httpx2", "httpx"]
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _get_namespace_through_lightkube() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
        )

    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://kube.invalid"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )
    client = Client(config, transport=httpx2.MockTransport(answer))
    assert client.get(Namespace, "x").metadata.name == "x"  # type: ignore[union-attr]


@pytest.mark.usefixtures("restore_levels")
def test_lightkube_requests_are_not_logged_at_info_once_quieted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    for name in operator.CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _get_namespace_through_lightkube()
    chatty = {r.name for r in caplog.records if r.levelno == logging.INFO}
    # Without the quieting, lightkube's transport logs the request (as "httpx2"): the test
    # sees what it is meant to silence.
    assert chatty, "lightkube's HTTP client no longer logs requests: revisit CHATTY_LOGGERS"
    caplog.clear()

    operator.quiet_chatty_loggers()
    _get_namespace_through_lightkube()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == []
    assert chatty <= set(operator.CHATTY_LOGGERS)


def _api_error(code: int) -> ApiError:
    request = httpx2.Request("GET", "https://api/x")
    response = httpx2.Response(code, json={"kind": "Status", "code": code}, request=request)
    return ApiError(request=request, response=response)


def test_an_api_server_down_restarting_or_overloaded_is_an_outage_and_a_refusal_is_not() -> None:
    outages = [
        httpx2.ConnectError("All connection attempts failed"),
        httpx2.ReadTimeout("timed out"),
        ConnectionResetError(),
        TimeoutError(),
        *(_api_error(code) for code in (429, 500, 503, 504)),
        # The leader Lease lapsed while the API server was away: writes are refused until
        # this process wins it back or another replica takes over.
        kube.NotLeader("not the leader: refusing to patch PostgresCluster/status"),
    ]
    assert all(kube.transient(error) for error in outages)
    defects = [_api_error(403), _api_error(404), _api_error(422), KeyError("spec"), ValueError()]
    assert not any(kube.transient(error) for error in defects)
