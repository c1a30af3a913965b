"""The operator's log stays readable: the HTTP clients' per-request INFO lines are quieted."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx2
import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Namespace

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
