"""Identity fixtures for the auth tests (test_auth.py), made at test time with pyjwt and
`cryptography`; nothing here talks to mcpyard.

- `SigningKey` / `make_keys`: an RSA 2048 key (RS256), an EC P-256 key (ES256) and an
  Ed25519 key (EdDSA), each with its own `kid`; `jwks` publishes public keys as a JWK Set.
- `claims` / `SigningKey.sign` / `token_of_length`: tokens with iss, aud, sub, exp, nbf,
  scope and groups, and signed tokens cut to an exact byte length.
- `JwksServer`: a JWK Set served over https from a thread (certificate from tlscerts.py's
  test CA, port chosen at run time), counting its GETs; the served set can change, or fail.
- `AuthServer`: a tiny OAuth authorization server over http from a thread: RFC 8414
  metadata, dynamic client registration (RFC 7591), `/authorize` that redirects at once with
  a code and the state, and `/token` (authorization_code with a PKCE S256 check) answering a
  JWT signed with a test key.

Run `python tests/py/authkit.py` to check the fixtures on their own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://login.test.example"
AUDIENCE = "https://mcp.test.example/mcp"
ALGORITHMS = ("RS256", "ES256", "EdDSA")


# --- keys and tokens ---------------------------------------------------------------------


@dataclass
class SigningKey:
    """A private key, the algorithm it signs with, and its `kid`."""

    alg: str
    kid: str
    private: Any

    def public_jwk(self, **extra: Any) -> dict[str, Any]:
        """The public half as a JWK with `kid`, `alg` and `use: sig` (`extra` overrides)."""
        public = self.private.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
        elif isinstance(public, ec.EllipticCurvePublicKey):
            jwk = ECAlgorithm.to_jwk(public, as_dict=True)
        else:
            jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig", **extra}

    def sign(self, claims: dict[str, Any], *, kid: str | None = "", headers: dict[str, Any] | None = None) -> str:
        """A JWT of `claims` signed with this key; its header names `kid` (default: this
        key's own; None: no `kid` at all), plus `headers`."""
        head: dict[str, Any] = dict(headers or {})
        if kid is not None:
            head["kid"] = kid or self.kid
        return jwt.encode(claims, self.private, algorithm=self.alg, headers=head)


def new_key(alg: str, kid: str) -> SigningKey:
    """A fresh key for `alg` (RS256: RSA 2048, ES256: P-256, EdDSA: Ed25519)."""
    if alg == "RS256":
        private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    elif alg == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        raise ValueError(f"no key type for {alg}")
    return SigningKey(alg=alg, kid=kid, private=private)


def make_keys() -> dict[str, SigningKey]:
    """One key per algorithm mcpyard accepts by default, keyed by algorithm."""
    return {alg: new_key(alg, f"test-{alg.lower()}-{secrets.token_hex(4)}") for alg in ALGORITHMS}


def jwks(*keys: SigningKey | dict[str, Any]) -> dict[str, Any]:
    """A JWK Set of the public halves of `keys` (a dict is taken as a JWK already)."""
    return {"keys": [k if isinstance(k, dict) else k.public_jwk() for k in keys]}


def claims(
    sub: str = "alice",
    *,
    scope: str | None = "mcp",
    groups: list[str] | None = None,
    iss: str = ISSUER,
    aud: str | list[str] = AUDIENCE,
    exp_in: float | None = 600,
    nbf_in: float | None = -5,
    **extra: Any,
) -> dict[str, Any]:
    """Token claims; `exp_in` and `nbf_in` are seconds from now (None leaves them out)."""
    now = int(time.time())
    out: dict[str, Any] = {"iss": iss, "aud": aud, "sub": sub, "iat": now}
    if exp_in is not None:
        out["exp"] = now + int(exp_in)
    if nbf_in is not None:
        out["nbf"] = now + int(nbf_in)
    if scope is not None:
        out["scope"] = scope
    if groups is not None:
        out["groups"] = groups
    out.update(extra)
    return out


def token_of_length(key: SigningKey, base: dict[str, Any], length: int) -> str:
    """A token signed by `key` exactly `length` bytes long: `base` plus a padding claim
    (and, since base64url lengths skip one residue mod 4, a padding header member)."""
    for header_pad in range(4):
        headers = {"pad": "x" * header_pad} if header_pad else None
        short = key.sign({**base, "pad": ""}, headers=headers)
        need = length - len(short)
        if need < 0:
            raise ValueError(f"{length} bytes is shorter than the bare token ({len(short)})")
        # Each padding byte adds 4/3 of a base64url character: start below, step up.
        for extra in range(max(0, need * 3 // 4 - 4), need * 3 // 4 + 8):
            token = key.sign({**base, "pad": "p" * extra}, headers=headers)
            if len(token) == length:
                return token
            if len(token) > length:
                break
    raise AssertionError(f"no token of exactly {length} bytes")


def s256(verifier: str) -> str:
    """The PKCE S256 challenge of `verifier`."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


# --- a JWK Set over https ------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass

    def reply(self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class JwksServer:
    """Serves `GET /jwks.json` over https (the test CA's `server` leaf, 127.0.0.1, a port
    chosen at run time) from a thread. `set_keys` changes the served set; `failing` makes it
    answer 503; `gets` are the monotonic times of the GETs of the set, in order."""

    def __init__(self, cert: Any, key: Any, served: dict[str, Any] | None = None) -> None:
        self.lock = threading.Lock()
        self.served: dict[str, Any] = served or {"keys": []}
        self.failing = False
        self._gets: list[float] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        owner = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/jwks.json":
                    self.reply(404, b"{}")
                    return
                with owner.lock:
                    owner._gets.append(time.monotonic())
                    failing = owner.failing
                    body = json.dumps(owner.served).encode()
                if failing:
                    self.reply(503, b"down\n", "text/plain")
                else:
                    self.reply(200, body, "application/jwk-set+json")

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        # The handshake happens in the handler's thread (on its first read), not in accept.
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "JwksServer":
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def set_keys(self, served: dict[str, Any]) -> None:
        with self.lock:
            self.served = served

    def set_failing(self, failing: bool) -> None:
        with self.lock:
            self.failing = failing

    @property
    def gets(self) -> list[float]:
        with self.lock:
            return list(self._gets)

    def wait_for_gets(self, count: int, timeout_s: float) -> bool:
        """True once at least `count` GETs arrived (polls until `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while len(self.gets) < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


# --- an OAuth authorization server -----------------------------------------------------------


@dataclass
class _Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    scope: str | None
    resource: str | None


@dataclass
class AuthServer:
    """A minimal OAuth 2.1 authorization server on http://127.0.0.1:<run-time port>; its
    issuer is its own URL (no trailing slash). Tokens it grants are signed by `key`, for
    `audience`, `sub` = `subject`, scope = what the client asked for. `seen` logs the
    requests as `METHOD /path`; `resources` the RFC 8707 `resource` values of the token
    requests; `registered` the client ids handed out."""

    key: SigningKey
    audience: str
    subject: str = "oauth-user"
    seen: list[str] = field(default_factory=list)
    resources: list[str | None] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[str, list[str]] = {}
        self.codes: dict[str, _Grant] = {}
        owner = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                owner._log("GET", self.path)
                path, _, query = self.path.partition("?")
                if path == "/.well-known/oauth-authorization-server":
                    self.reply(200, json.dumps(owner.metadata()).encode())
                elif path == "/authorize":
                    status, headers, body = owner._authorize(parse_qs(query))
                    self.reply(status, body, "text/plain", headers)
                else:
                    self.reply(404, b'{"error":"not_found"}')

            def do_POST(self) -> None:
                owner._log("POST", self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                path = self.path.partition("?")[0]
                if path == "/register":
                    status, answer = owner._register(json.loads(body or b"{}"))
                elif path == "/token":
                    status, answer = owner._token(parse_qs(body.decode()))
                else:
                    status, answer = 404, {"error": "not_found"}
                self.reply(status, json.dumps(answer).encode())

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "AuthServer":
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _log(self, method: str, path: str) -> None:
        with self.lock:
            self.seen.append(f"{method} {path.partition('?')[0]}")

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "registration_endpoint": f"{self.url}/register",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
        }

    def _register(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        uris = request.get("redirect_uris")
        if not isinstance(uris, list) or not uris:
            return 400, {"error": "invalid_redirect_uri"}
        client_id = f"client-{secrets.token_hex(6)}"
        with self.lock:
            self.clients[client_id] = [str(u) for u in uris]
            self.registered.append(client_id)
        return 201, {
            "client_id": client_id,
            "client_id_issued_at": int(time.time()),
            "redirect_uris": uris,
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            **({"scope": request["scope"]} if request.get("scope") else {}),
        }

    def _authorize(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        one = {k: v[0] for k, v in query.items()}
        with self.lock:
            uris = self.clients.get(one.get("client_id", ""))
        if uris is None or one.get("redirect_uri") not in uris:
            return 400, {}, b"unknown client or redirect_uri\n"
        if one.get("response_type") != "code" or one.get("code_challenge_method") != "S256" or not one.get("code_challenge"):
            return 400, {}, b"code flow with PKCE S256 only\n"
        code = secrets.token_urlsafe(16)
        with self.lock:
            self.codes[code] = _Grant(
                client_id=one["client_id"],
                redirect_uri=one["redirect_uri"],
                challenge=one["code_challenge"],
                scope=one.get("scope"),
                resource=one.get("resource"),
            )
        location = f"{one['redirect_uri']}?{urlencode({'code': code, 'state': one.get('state', '')})}"
        return 302, {"Location": location}, b""

    def _token(self, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        one = {k: v[0] for k, v in form.items()}
        if one.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        with self.lock:
            grant = self.codes.pop(one.get("code", ""), None)
        if grant is None:
            return 400, {"error": "invalid_grant", "error_description": "unknown or used code"}
        if one.get("client_id") != grant.client_id or one.get("redirect_uri") != grant.redirect_uri:
            return 400, {"error": "invalid_grant", "error_description": "client or redirect_uri differs"}
        if s256(one.get("code_verifier", "")) != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verification failed"}
        token = self.key.sign(claims(self.subject, scope=grant.scope, iss=self.url, aud=self.audience))
        with self.lock:
            self.resources.append(one.get("resource"))
            self.issued.append(token)
        answer: dict[str, Any] = {"access_token": token, "token_type": "Bearer", "expires_in": 600}
        if grant.scope:
            answer["scope"] = grant.scope
        return 200, answer


def follow_authorize(url: str) -> tuple[str, str]:
    """What a browser would do with an authorization URL of `AuthServer`: GET it and read
    the redirect; returns (code, state) from the Location (the redirect target itself is
    never contacted)."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        opener.open(url, timeout=10)
    except urllib.error.HTTPError as e:
        if e.code != 302:
            raise AssertionError(f"/authorize answered {e.code}: {e.read()!r}") from e
        location = e.headers["Location"]
    else:
        raise AssertionError("/authorize did not redirect")
    query = parse_qs(urlsplit(location).query)
    return query["code"][0], query["state"][0]


# --- self-check ------------------------------------------------------------------------------


def _self_check() -> None:
    """Exercises every fixture without mcpyard: keys verify their own tokens through the
    published JWKS, the https JWKS server serves and counts, the AS completes a PKCE flow."""
    import tempfile
    import urllib.error
    import urllib.request
    from pathlib import Path

    import tlscerts

    keys = make_keys()
    published = jwks(*keys.values())
    for alg, key in keys.items():
        token = key.sign(claims(groups=["ops"]))
        header = jwt.get_unverified_header(token)
        assert header["kid"] == key.kid and header["alg"] == alg, header
        jwk = next(k for k in published["keys"] if k["kid"] == key.kid)
        public = jwt.PyJWK(jwk).key
        decoded = jwt.decode(token, public, algorithms=[alg], audience=AUDIENCE, issuer=ISSUER)
        assert decoded["sub"] == "alice" and decoded["groups"] == ["ops"], decoded
    for length in (8192, 8193, 9000):
        assert len(token_of_length(keys["RS256"], claims(), length)) == length

    with tempfile.TemporaryDirectory() as tmp:
        material = tlscerts.make(Path(tmp))
        server = JwksServer(material.server.cert, material.server.key, jwks(keys["RS256"])).start()
        try:
            context = ssl.create_default_context(cafile=str(material.ca.pem))
            with urllib.request.urlopen(server.url, context=context, timeout=5) as r:
                assert json.loads(r.read())["keys"][0]["kid"] == keys["RS256"].kid
            server.set_keys(jwks(keys["RS256"], keys["ES256"]))
            with urllib.request.urlopen(server.url, context=context, timeout=5) as r:
                assert len(json.loads(r.read())["keys"]) == 2
            assert len(server.gets) == 2
        finally:
            server.close()

    auth = AuthServer(keys["ES256"], audience="http://127.0.0.1:1/mcp").start()
    try:
        with urllib.request.urlopen(f"{auth.url}/.well-known/oauth-authorization-server", timeout=5) as r:
            assert json.loads(r.read())["issuer"] == auth.url
        redirect = "http://127.0.0.1:1/callback"
        request = urllib.request.Request(
            f"{auth.url}/register",
            data=json.dumps({"redirect_uris": [redirect]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            client_id = json.loads(r.read())["client_id"]
        verifier = secrets.token_urlsafe(48)
        query = urlencode({
            "response_type": "code", "client_id": client_id, "redirect_uri": redirect, "state": "st8",
            "code_challenge": s256(verifier), "code_challenge_method": "S256", "scope": "mcp",
            "resource": "http://127.0.0.1:1/mcp",
        })  # fmt: skip
        code, state = follow_authorize(f"{auth.url}/authorize?{query}")
        assert state == "st8"
        form = urlencode({
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect,
            "client_id": client_id, "code_verifier": verifier, "resource": "http://127.0.0.1:1/mcp",
        }).encode()  # fmt: skip
        with urllib.request.urlopen(urllib.request.Request(f"{auth.url}/token", data=form), timeout=5) as r:
            answer = json.loads(r.read())
        public = jwt.PyJWK(keys["ES256"].public_jwk()).key
        decoded = jwt.decode(answer["access_token"], public, algorithms=["ES256"], audience="http://127.0.0.1:1/mcp")
        assert decoded["iss"] == auth.url and decoded["scope"] == "mcp", decoded
        assert auth.resources == ["http://127.0.0.1:1/mcp"]
        # A code is used once; a wrong verifier is refused.
        try:
            urllib.request.urlopen(urllib.request.Request(f"{auth.url}/token", data=form), timeout=5)
        except urllib.error.HTTPError as e:
            assert e.code == 400
        else:
            raise AssertionError("a used code was accepted")
        assert auth.seen == [
            "GET /.well-known/oauth-authorization-server", "POST /register", "GET /authorize", "POST /token", "POST /token",
        ], auth.seen  # fmt: skip
    finally:
        auth.close()
    print("authkit: keys, tokens, JWKS over https and the authorization server work")


if __name__ == "__main__":
    _self_check()
