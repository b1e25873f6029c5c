"""The region launcher's control endpoint refuses every request it cannot authenticate: by mutual TLS with
[tls] on, by an HMAC of the shared secret without it (wrong secret, no signature, a replay, a stale time),
and everything when neither is configured; an authenticated request reaches the launcher's callbacks."""
from __future__ import annotations

import http.client
import json
import secrets
import ssl
import time

import pytest

from photon import free_port, parse_config
from photon.app._control import (H_NONCE, H_SIGNATURE, H_TIME, REGION_PATH, STATUS_PATH, ControlError, ControlServer,
                                 control_request, region_status_remote, set_region_remote, sign)
from photon.app._deployment import control_address
from photon.app import make_certs


def _config(tmp_path, tls=None, secret=None, max_skew_s=60.0):
    base = free_port() - 3
    data = {"regions": [{"name": "a", "log_root": str(tmp_path / "l"), "output_root": str(tmp_path / "o"),
                         "state_dir": str(tmp_path / "s"), "port_base": base}],
            "control": {"max_skew_s": max_skew_s, "timeout_s": 5.0}}
    if tls:
        data["tls"] = {k: tls[k] for k in ("ca", "cert", "key")}
    if secret is not None:
        path = tmp_path / f"control-{secrets.token_hex(3)}.secret"
        path.write_text(secret)
        data["control"]["secret_file"] = str(path)
    return parse_config(data, "photon.toml", tmp_path)


class Launcher:
    """The callbacks a launcher gives its endpoint, recording what was asked."""

    def __init__(self) -> None:
        self.wishes = []
        self.said = []

    def status(self) -> dict:
        return {"launcher_pid": 42, "regions": {"a": {"down": bool(self.wishes and self.wishes[-1][1]), "lost": 3}}}

    def set_region(self, name, down, hard, wait_s) -> dict:
        self.wishes.append((name, down, hard))
        return {"seq": len(self.wishes), "down": down, "processes": ["a-j0"]}


@pytest.fixture
def serve():
    started = []

    def start(config):
        launcher = Launcher()
        server = ControlServer(config, config.regions[0], launcher.status, launcher.set_region,
                               launcher.said.append).start()
        started.append(server)
        return launcher

    yield start
    for server in started:
        server.stop()


@pytest.mark.timeout(60)
def test_shared_secret_signed_requests_are_served_and_unsigned_wrong_replayed_or_stale_ones_refused(tmp_path, serve):
    secret = secrets.token_urlsafe(32)
    config = _config(tmp_path, secret=secret)
    launcher = serve(config)
    region = config.regions[0]
    assert region_status_remote(config, region)["regions"]["a"]["lost"] == 3
    answer = set_region_remote(config, region, down=True, hard=True, wait_s=5)
    assert answer["down"] is True and launcher.wishes == [("a", True, True)]
    assert any("region a down --hard asked from 127.0.0.1" in s for s in launcher.said)

    with pytest.raises(ControlError, match="401.*bad signature"):
        control_request(_config(tmp_path, secret=secrets.token_urlsafe(32)), region, "GET", STATUS_PATH)
    host, port = control_address(region).rsplit(":", 1)

    def raw(headers, body=b'{"region": "a", "down": false}'):
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("POST", REGION_PATH, body=body, headers={"Content-Length": str(len(body)), **headers})
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    assert raw({}) == (401, {"error": "unsigned request refused"})
    body = b'{"region": "a", "down": false}'
    at, nonce = f"{time.time():.3f}", secrets.token_hex(8)
    signed = {H_TIME: at, H_NONCE: nonce, H_SIGNATURE: sign(secret.encode(), "POST", REGION_PATH, at, nonce, body)}
    assert raw(signed, body)[0] == 200
    assert raw(signed, body) == (401, {"error": "replayed request refused"})
    assert raw(signed, body.replace(b"false", b"true"))[0] == 401       # the body is signed too
    old = f"{time.time() - 3600:.3f}"
    stale = {H_TIME: old, H_NONCE: "n2", H_SIGNATURE: sign(secret.encode(), "POST", REGION_PATH, old, "n2", body)}
    status, answer = raw(stale, body)
    assert status == 401 and "away from the launcher's clock" in answer["error"]
    assert launcher.wishes == [("a", True, True), ("a", False, False)]      # only the two authenticated wishes


@pytest.mark.timeout(60)
def test_without_tls_or_secret_every_request_is_refused(tmp_path, serve):
    config = _config(tmp_path)
    launcher = serve(config)
    host, port = control_address(config.regions[0]).rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", STATUS_PATH)
    r = conn.getresponse()
    assert r.status == 403 and "remote control is off" in json.loads(r.read())["error"]
    conn.close()
    with pytest.raises(ControlError, match="needs \\[tls\\] or \\[control\\].secret_file"):
        region_status_remote(config, config.regions[0])
    assert launcher.wishes == []


@pytest.mark.timeout(60)
def test_mutual_tls_serves_a_client_with_the_deployments_certificate_and_refuses_one_without(tmp_path, serve):
    tls = make_certs(tmp_path / "tls")
    config = _config(tmp_path, tls=tls)
    launcher = serve(config)
    region = config.regions[0]
    assert set_region_remote(config, region, down=False, hard=False, wait_s=5)["down"] is False
    assert launcher.wishes == [("a", False, False)]
    host, port = control_address(region).rsplit(":", 1)
    # the CA is trusted, but no client certificate is presented: the handshake fails, nothing is served
    ctx = ssl.create_default_context(cafile=tls["ca"])
    ctx.check_hostname = False
    conn = http.client.HTTPSConnection(host, int(port), timeout=5, context=ctx)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError)):
        conn.request("GET", STATUS_PATH)
        conn.getresponse().read()
    conn.close()
    # another CA's certificate is refused too
    other = make_certs(tmp_path / "other")
    stranger = _config(tmp_path, tls=other)
    stranger = stranger.__class__(**{**stranger.__dict__, "regions": config.regions})
    with pytest.raises(ControlError, match="did not answer"):
        region_status_remote(stranger, region)
    assert launcher.wishes == [("a", False, False)]
