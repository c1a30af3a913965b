"""Which transport a kubeconfig gets, and how a rotated token file is followed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube.config.kubeconfig import KubeConfig

from stateward.runtime import transport
from stateward.runtime.transport import AiohttpTransport, HttpxTransport, for_kubeconfig

pytestmark = pytest.mark.unit


def kubeconfig(user: dict[str, Any]) -> KubeConfig:
    return KubeConfig.from_dict(
        {
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": "https://127.0.0.1:6443/",
                        "insecure-skip-tls-verify": True,
                    },
                }
            ],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


def test_a_token_user_goes_through_aiohttp_a_plugin_user_through_lightkube() -> None:
    fallback = httpx2.AsyncClient()
    chosen = for_kubeconfig(kubeconfig({"token": "t"}), connections=4, fallback=fallback)
    assert isinstance(chosen, AiohttpTransport)
    assert chosen.server == "https://127.0.0.1:6443"
    assert chosen._authorization() == "Bearer t"
    plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}}
    chosen = for_kubeconfig(kubeconfig(plugin), connections=4, fallback=fallback)
    assert isinstance(chosen, HttpxTransport) and chosen.http is fallback


def test_a_token_file_is_read_again_after_a_minute_or_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [1000.0]
    monkeypatch.setattr(transport.time, "monotonic", lambda: now[0])
    sent = AiohttpTransport("https://k", None, connections=1, token_file=str(token))
    assert sent._authorization() == "Bearer first"
    token.write_text("second\n")  # the kubelet rotated it
    now[0] += transport.TOKEN_MAX_AGE - 1
    assert sent._authorization() == "Bearer first"  # not read again within the minute
    assert sent._authorization(fresh=True) == "Bearer second"  # after a 401
    token.write_text("third\n")
    now[0] += transport.TOKEN_MAX_AGE
    assert sent._authorization() == "Bearer third"


def test_a_client_certificate_user_sends_no_authorization_header() -> None:
    sent = AiohttpTransport("https://k", None, connections=1)
    assert sent._authorization() is None
