"""The control endpoint of a region launcher: ``photon region down|up`` and ``photon status`` from any
machine holding the config.

Every ``photon run`` serves one endpoint per region it runs that has a ``port_base``, bound to the
region's ``host`` at ``port_base + REGION_PORTS["control"]`` (see :func:`control_address`), over HTTP:

* ``GET /v1/status``: ``{"launcher_pid", "regions": {name: {"down", "seq", "lost", "unrecorded",
  "processes": {name: {"pid", "role", "restarts"}}}}}``;
* ``POST /v1/region`` with ``{"region", "down", "hard", "wait_s"}``: the same durable wish
  ``photon region`` writes on the launcher's own machine (``region-control.json``), answered once the
  launcher has acted, with what it did (``region-state.json``).

Every request is authenticated, and an unauthenticated one is refused (HTTP 401) before it is read:

* with ``[tls]`` on, by mutual TLS: the endpoint requires a client certificate signed by the CA, and the
  client checks the endpoint's certificate for ``[tls].server_name``, as every gRPC connection does;
* with ``[tls]`` off, by the shared secret in ``[control].secret_file``: the client signs method, path,
  time, a nonce and the body with HMAC-SHA256; the endpoint refuses a wrong signature, a time more than
  ``[control].max_skew_s`` from its clock and a nonce it has seen (no replay);
* with neither, every request is refused (HTTP 403, saying so): remote control is off.
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import http.server
import json
import secrets
import ssl
import threading
import time
from collections import OrderedDict
from pathlib import Path

from photon import NamedHTTPSConnection, PhotonConfig, RegionConfig, tls_files, tls_paths
from photon.app._deployment import control_address

STATUS_PATH, REGION_PATH = "/v1/status", "/v1/region"
H_TIME, H_NONCE, H_SIGNATURE = "X-Photon-Time", "X-Photon-Nonce", "X-Photon-Signature"
MAX_BODY = 64 << 10


class ControlError(RuntimeError):
    """A control endpoint could not be reached, refused the request, or failed it (the message says which)."""


def _read_secret(config: PhotonConfig) -> bytes | None:
    path = config.control.secret_file
    if not path:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise ControlError(f"[control].secret_file {path!r} cannot be read: {e}") from None
    if len(secret) < 16:
        raise ControlError(f"[control].secret_file {path!r} holds less than 16 bytes; make one with "
                           f"`head -c 32 /dev/urandom | base64 > {path}`")
    return secret


def auth_kind(config: PhotonConfig) -> str:
    """``"tls"``, ``"secret"`` or ``""`` (remote control off): how control requests are authenticated."""
    if config.tls.ca:
        return "tls"
    return "secret" if config.control.secret_file else ""


def sign(secret: bytes, method: str, path: str, at: str, nonce: str, body: bytes) -> str:
    """The HMAC-SHA256 (hex) a request without TLS carries."""
    message = b"\n".join([method.encode(), path.encode(), at.encode(), nonce.encode(), body])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class _Nonces:
    """Nonces seen within the allowed skew (a replayed request is refused)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_use(self, nonce: str, now: float) -> bool:
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - 2 * self.keep_s:
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            return True


class ControlServer:
    """One region's control endpoint (see the module). ``status()`` returns the launcher's status dict;
    ``set_region(name, down, hard, wait_s)`` records the wish and returns the launcher's answer (it runs in
    the request's thread while the launcher's loop acts on it). ``echo`` says who asked what."""

    def __init__(self, config: PhotonConfig, region: RegionConfig, status, set_region, echo) -> None:
        self.config, self.region = config, region
        self.address = control_address(region)
        self.kind = auth_kind(config)
        self.secret = _read_secret(config) if self.kind == "secret" else None
        self._nonces = _Nonces(config.control.max_skew_s)
        self._status, self._set_region, self._echo = status, set_region, echo
        host, port = self.address.rsplit(":", 1)
        self.httpd = http.server.ThreadingHTTPServer((host, int(port)), self._handler_class())
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, client_address: None   # a client that fails TLS: refused quietly
        if self.kind == "tls":
            ca, cert, key = tls_paths() or (config.tls.ca, config.tls.cert, config.tls.key)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            ctx.load_verify_locations(ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"control-{region.name}", daemon=True)

    def start(self) -> "ControlServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)

    def _authenticated(self, method: str, path: str, headers, body: bytes) -> tuple[int, str]:
        """``(0, "")`` when the request may be served, else the HTTP code and why not."""
        if self.kind == "tls":
            return 0, ""                       # the handshake already required a certificate the CA signed
        if self.kind != "secret":
            return 403, ("this launcher has neither [tls] nor [control].secret_file: remote control is off "
                         "(run the command on the region's machine, or configure one of them)")
        at, nonce, signature = headers.get(H_TIME, ""), headers.get(H_NONCE, ""), headers.get(H_SIGNATURE, "")
        if not (at and nonce and signature):
            return 401, "unsigned request refused"
        if not hmac.compare_digest(sign(self.secret, method, path, at, nonce, body), signature):
            return 401, "bad signature (is [control].secret_file the same file on both machines?)"
        try:
            skew = abs(time.time() - float(at))
        except ValueError:
            return 401, "bad time"
        if skew > self.config.control.max_skew_s:
            return 401, f"request time {skew:.0f} s away from the launcher's clock (max {self.config.control.max_skew_s:g} s)"
        if not self._nonces.first_use(nonce, time.time()):
            return 401, "replayed request refused"
        return 0, ""

    def _handler_class(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30

            def setup(self) -> None:
                super().setup()
                if server.kind == "tls":
                    self.connection.settimeout(10)
                    self.connection.do_handshake()    # in this request's thread: a slow client blocks no other

            def log_message(self, *args) -> None:     # requests are echoed by the launcher, not logged raw
                pass

            def _answer(self, code: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    return self._answer(413, {"error": "request too large"})
                body = self.rfile.read(length) if length else b""
                code, why = server._authenticated(method, self.path, self.headers, body)
                if code:
                    return self._answer(code, {"error": why})
                try:
                    code, payload = server._route(method, self.path, body, self.client_address[0])
                except Exception as e:  # noqa: BLE001  (said to the caller, the launcher goes on)
                    code, payload = 500, {"error": f"{type(e).__name__}: {e}"}
                self._answer(code, payload)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler

    def _route(self, method: str, path: str, body: bytes, peer: str) -> tuple[int, dict]:
        if method == "GET" and path == STATUS_PATH:
            return 200, self._status()
        if method == "POST" and path == REGION_PATH:
            wish = json.loads(body or b"{}")
            if wish.get("region") != self.region.name:
                return 400, {"error": f"this endpoint controls region {self.region.name!r}, not {wish.get('region')!r}"}
            down, hard = bool(wish.get("down")), bool(wish.get("hard"))
            self._echo(f"control: region {self.region.name} {'down' + (' --hard' if hard else '') if down else 'up'} "
                       f"asked from {peer}")
            return 200, self._set_region(self.region.name, down, hard, float(wish.get("wait_s", 60.0)))
        return 404, {"error": f"no {method} {path}"}


def serve_controls(config: PhotonConfig, regions: list, status, set_region, echo) -> list[ControlServer]:
    """Start the control endpoint of every region in ``regions`` that has a ``port_base`` (a port that
    cannot be bound is said, and the run goes on without that endpoint)."""
    servers = []
    for region in regions:
        if not region.port_base:
            continue
        try:
            servers.append(ControlServer(config, region, status, set_region, echo).start())
        except (OSError, ControlError) as e:
            echo(f"warning: region {region.name}'s control endpoint at {control_address(region)} is not served: {e}")
    return servers


def _client_context(config: PhotonConfig) -> ssl.SSLContext:
    files = tls_files()
    ca, cert, key = tls_paths() if files else (config.tls.ca, config.tls.cert, config.tls.key)
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    return ctx


def control_request(config: PhotonConfig, region: RegionConfig, method: str, path: str, payload: dict | None = None,
                    timeout_s: float | None = None) -> dict:
    """Send one authenticated request to ``region``'s control endpoint and return its JSON answer. Raises
    :class:`ControlError` naming the endpoint when it cannot be reached, refuses, or fails."""
    address = control_address(region)
    if address is None:
        raise ControlError(f"region {region.name!r} has no port_base: its control endpoint's address is known "
                           f"only on its machine")
    kind = auth_kind(config)
    if not kind:
        raise ControlError("remote control needs [tls] or [control].secret_file in the config (on both machines)")
    host, port = address.rsplit(":", 1)
    timeout_s = timeout_s or config.control.timeout_s
    body = json.dumps(payload).encode() if payload is not None else b""
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    if kind == "tls":
        conn = NamedHTTPSConnection(host, int(port), config.tls.server_name, timeout=timeout_s, context=_client_context(config))
    else:
        secret = _read_secret(config)
        at, nonce = f"{time.time():.3f}", secrets.token_hex(16)
        headers.update({H_TIME: at, H_NONCE: nonce, H_SIGNATURE: sign(secret, method, path, at, nonce, body)})
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        text = response.read()
    except (OSError, http.client.HTTPException, ssl.SSLError) as e:
        raise ControlError(f"region {region.name}'s control endpoint {address} did not answer ({e}); is its "
                           f"launcher (photon run --region {region.name}) running?") from None
    finally:
        conn.close()
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"error": text[:200].decode(errors="replace")}
    if response.status != 200:
        raise ControlError(f"region {region.name}'s control endpoint {address} answered {response.status}: "
                           f"{answer.get('error', answer)}")
    return answer


def region_status_remote(config: PhotonConfig, region: RegionConfig, timeout_s: float | None = None) -> dict:
    """What ``region``'s launcher says about itself (``GET /v1/status``)."""
    return control_request(config, region, "GET", STATUS_PATH, timeout_s=timeout_s)


def set_region_remote(config: PhotonConfig, region: RegionConfig, down: bool, hard: bool, wait_s: float) -> dict:
    """Ask ``region``'s launcher over the network to take it down or bring it back; returns its answer."""
    return control_request(config, region, "POST", REGION_PATH,
                           {"region": region.name, "down": down, "hard": hard, "wait_s": wait_s},
                           timeout_s=config.control.timeout_s + wait_s)

