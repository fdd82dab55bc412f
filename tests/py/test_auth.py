"""Identity at the gateway (docs/auth.md): a server binding with `auth:` verifies bearer
tokens itself, publishes protected-resource metadata (RFC 9728), hides what rules keep
from a caller, and holds each caller to its rate limits.

Keys and tokens are made at test time (authkit.py: RS256, ES256 and EdDSA keys with their
own `kid`s, a JWK Set in a file or served over https by a thread, a tiny OAuth
authorization server). Every answer is checked to the byte where docs/auth.md fixes it:
statuses, `WWW-Authenticate` values, the 429 body, the metadata JSON, metric names.
mcpyard listens on ports chosen at run time; its metrics port is picked the same way
(bind, read, close) before it starts.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import jwt
import pytest
from mcp import ClientSession
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

import authkit
import harness
import helpers
from authkit import AUDIENCE, ISSUER, claims
from helpers import connect, raw_exchange, tool_text
from fault_upstream import FaultUpstream
from fault_upstream import challenge as fault_challenge
from rawmcp import ACCEPT, PROTOCOL, RawSession

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

TIMEOUT_S = 10
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
INVALID_PARAMS = -32602
RESOURCE_NOT_FOUND = -32002
RATE_LIMITED = -32000
# mcpyard's own phrases for `error_description` (docs/auth.md, "Verifying the token").
PHRASES = {
    "token expired",
    "token not yet valid",
    "signature invalid",
    "unknown key",
    "wrong issuer",
    "wrong audience",
    "algorithm not allowed",
    "malformed token",
    "token too long",
    "token without subject",
}
AUTH_TOKEN_BYTES_MAX = 8 * 1024
JWKS_UNKNOWN_KID_WAIT_S = 2.0
JWKS_REFETCH_INTERVAL_MIN_S = 10.0
WELL_KNOWN = "/.well-known/oauth-protected-resource"

# Most scenarios run on one epoll worker; the session-bound and happy-path ones also on two
# io_uring workers (a session's requests may arrive on the worker that does not own it).
RUNTIMES = [(1, "epoll"), (2, "uring")]


def runtime_id(runtime: tuple[int, str]) -> str:
    return f"w{runtime[0]}-{runtime[1]}"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def run(fn, *args, timeout_s: float = 40) -> None:
    helpers.run(fn, *args, timeout_s=timeout_s)


# --- mcpyard with `auth:` ------------------------------------------------------------------


def gateway_config(
    auth: dict[str, Any],
    *,
    runtime: tuple[int, str],
    metrics_port: int,
    proxy: bool = False,
    cache: bool = False,
    a_exit: str | None = None,
) -> str:
    """`north` (server, with `auth` as its `auth:` block) in front of the demo exit, or of a
    proxy whose toolkits `a` and `b` are two demo bindings (`cache`: the lists come from a
    memory-store cache; `a_exit`: toolkit `a`'s binding instead, a YAML flow mapping). The
    auth block is written as a JSON flow mapping, which YAML reads."""
    workers, io = runtime
    lines = [
        f"runtime: {{ workers: {workers}, io: {io} }}",
        f"telemetry: {{ metrics: 127.0.0.1:{metrics_port} }}",
    ]
    if cache:
        lines.append("stores: { cache0: { type: memory } }")
    lines += [
        "bindings:",
        "  north:",
        "    kind: server",
        "    listen: 127.0.0.1:0",
        "    path: /mcp",
        f"    exit: {'tools' if proxy else 'demo'}",
        f"    auth: {json.dumps(auth)}",
    ]
    if proxy:
        lines += ["  tools:", "    kind: proxy"]
        if cache:
            lines.append("    cache: { store: cache0, ttl: 5m }")
        lines += [
            "    routes:",
            "      - { toolkit: a, exit: demo_a }",
            "      - { toolkit: b, exit: demo_b }",
            f"  demo_a: {a_exit or '{ kind: demo, progress_interval: 20ms }'}",
            "  demo_b: { kind: demo, progress_interval: 20ms }",
        ]
    else:
        lines.append("  demo: { kind: demo, progress_interval: 20ms }")
    return "\n".join(lines) + "\n"


def jwt_block(jwks: str, **extra: Any) -> dict[str, Any]:
    """`auth.jwt` for the test issuer and audience, the key set at `jwks`."""
    return {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": jwks, **extra}


@dataclass
class Gateway:
    """A running mcpyard with `auth:`: its MCP URL, origin, metadata URL and metrics."""

    child: harness.Child
    metrics_port: int

    @property
    def url(self) -> str:
        return self.child.address

    @property
    def origin(self) -> str:
        return self.url.rsplit("/mcp", 1)[0]

    @property
    def prm_url(self) -> str:
        """The metadata URL mcpyard derives from the Host (no `auth.resource`)."""
        return f"{self.origin}{WELL_KNOWN}/mcp"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=TIMEOUT_S) as r:
            return r.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """One sample (0 when absent); `labels` must be all of the sample's labels."""
        label = ",".join(f'{k}="{v}"' for k, v in labels.items())
        series = f"{name}{{{label}}}" if label else name
        m = re.search(rf"^{re.escape(series)} (\S+)$", self.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def wait_metric(self, name: str, at_least: float, **labels: str) -> float:
        deadline = time.monotonic() + TIMEOUT_S
        while (value := self.metric(name, **labels)) < at_least:
            assert time.monotonic() < deadline, f"{name}{labels} stayed at {value} (< {at_least}):\n{self.metrics()}"
            time.sleep(0.05)
        return value


def start_gateway(
    workdir: Path,
    auth: dict[str, Any],
    *,
    runtime: tuple[int, str] = (1, "epoll"),
    files: dict[str, Any] | None = None,
    proxy: bool = False,
    cache: bool = False,
    a_exit: str | None = None,
) -> Gateway:
    """mcpyard in `workdir` with `files` (name: JSON value) written beside its config."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name, value in (files or {}).items():
        (workdir / name).write_text(json.dumps(value))
    config = gateway_config(auth, runtime=runtime, metrics_port=0, proxy=proxy, cache=cache, a_exit=a_exit)
    child = harness.start_mcpyard(config, workdir)
    return Gateway(child=child, metrics_port=child.metrics_port())


@pytest.fixture
def gateways(tmp_path: Path):
    """Starts gateways for one test (`start(auth, **options)`); teardown: SIGTERM, exit 0."""
    started: list[Gateway] = []

    def start(auth: dict[str, Any], **options: Any) -> Gateway:
        gateway = start_gateway(tmp_path / f"gw{len(started)}", auth, **options)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        harness.stop_mcpyard(gateway.child)


@pytest.fixture(scope="module")
def keys() -> dict[str, authkit.SigningKey]:
    return authkit.make_keys()


@pytest.fixture(scope="module")
def enc_key() -> authkit.SigningKey:
    """A key the standard set lists with `"use":"enc"`: never used to verify."""
    return authkit.new_key("RS256", f"enc-{uuid.uuid4().hex[:8]}")


def standard_auth(**extra: Any) -> dict[str, Any]:
    return {"scopes": ["mcp"], "jwt": jwt_block("jwks.json"), **extra}


def standard_files(keys: dict[str, authkit.SigningKey], enc_key: authkit.SigningKey) -> dict[str, Any]:
    return {"jwks.json": authkit.jwks(*keys.values(), enc_key.public_jwk(use="enc"))}


@pytest.fixture(scope="module")
def standard(tmp_path_factory, keys, enc_key):
    """The gateway most rejection tests share: one epoll worker, `scopes: [mcp]`, the three
    keys (and an encryption key) from `jwks.json`, no `resource`, no rules."""
    gateway = start_gateway(tmp_path_factory.mktemp("auth-standard"), standard_auth(), files=standard_files(keys, enc_key))
    yield gateway
    harness.stop_mcpyard(gateway.child)


def token(keys: dict[str, authkit.SigningKey], alg: str = "RS256", sub: str = "alice", **kw: Any) -> str:
    return keys[alg].sign(claims(sub, **kw))


# --- raw HTTP helpers ------------------------------------------------------------------------


def initialize_message(request_id: Any = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "auth-test", "version": "0"}},
    }


async def post_initialize(client: httpx2.AsyncClient, url: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    """One `initialize` POST without a session, with `headers` (e.g. Authorization)."""
    h = {"accept": ACCEPT, "content-type": "application/json", **(headers or {})}
    return await client.post(url, content=json.dumps(initialize_message()), headers=h)


def challenge(response: httpx2.Response) -> str:
    """The one `WWW-Authenticate` value of `response`."""
    values = response.headers.get_list("www-authenticate")
    assert len(values) == 1, f"expected one WWW-Authenticate, got {values} (HTTP {response.status_code})"
    return values[0]


def assert_refusal(response: httpx2.Response, status: int, www_authenticate: str | None) -> None:
    """`status`, exactly `www_authenticate` (None: no such header), and a JSON-RPC error
    without id: code -32600 for 401/403, -32603 for 503 (the gateway's own condition)."""
    assert response.status_code == status, f"HTTP {response.status_code} {response.text[:300]!r}"
    if www_authenticate is None:
        assert "www-authenticate" not in response.headers, response.headers
    else:
        assert challenge(response) == www_authenticate
    body = json.loads(response.text)
    assert body["jsonrpc"] == "2.0", body
    # docs/auth.md: "a JSON-RPC error without id": an absent id or `"id":null`.
    assert body.get("id") is None, body
    assert body["error"]["code"] == (INTERNAL_ERROR if status == 503 else INVALID_REQUEST), body


def invalid_token(description: str, prm_url: str) -> str:
    return f'Bearer error="invalid_token", error_description="{description}", resource_metadata="{prm_url}"'



def raw_initialize(url: str, authorization: bytes) -> bytes:
    host = url.split("//")[1].split("/")[0]
    body = json.dumps(initialize_message()).encode()
    request = (
        b"POST /mcp HTTP/1.1\r\nhost: " + host.encode() + b"\r\ncontent-type: application/json\r\n"
        b"accept: application/json, text/event-stream\r\nauthorization: " + authorization + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    return raw_exchange(url, request)


async def exercise_session(session: RawSession) -> None:
    """initialize, tools/list and tools/call echo on a raw session, all 200."""
    await session.initialize()
    listed = await session.request("tools/list")
    assert listed.status == 200, listed.body
    assert "echo" in [t["name"] for t in listed.result["tools"]]
    called = await session.request("tools/call", {"name": "echo", "arguments": {"text": "who goes there"}})
    assert called.status == 200, called.body
    assert called.result["content"] == [{"type": "text", "text": "who goes there"}]


# --- 1. valid tokens --------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES, ids=runtime_id)
def test_a_valid_token_of_each_algorithm_opens_a_working_session(runtime, gateways, keys, enc_key):
    """RS256, ES256 and EdDSA tokens from a JWKS file each open sessions that list and call
    tools, over raw HTTP and through the SDK with a static Authorization header; later
    requests of a session hit the per-worker memory of verified tokens."""
    gw = gateways(standard_auth(), runtime=runtime, files=standard_files(keys, enc_key))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for alg in authkit.ALGORITHMS:
                await exercise_session(RawSession(client, gw.url, headers=bearer(token(keys, alg, sub=f"raw-{alg}"))))
        for alg in authkit.ALGORITHMS:
            headers = bearer(token(keys, alg, sub=f"sdk-{alg}"))
            async with connect(gw.url, headers=headers) as (session, wire, init):
                assert init is not None and init.server_info.name == "mcpyard"
                assert wire.session_id
                tools = await session.list_tools()
                assert "echo" in [t.name for t in tools.tools]
                result = await session.call_tool("echo", {"text": f"signed with {alg}"})
                assert tool_text(result) == f"signed with {alg}"
                added = await session.call_tool("add", {"a": 40, "b": 2})
                assert added.structured_content == {"sum": 42}

    run(scenario)
    assert gw.metric("mcpyard_auth_verified_total", cached="false") >= 6
    assert gw.metric("mcpyard_auth_verified_total", cached="true") >= 6
    assert gw.metric("mcpyard_auth_rejected_total", reason="invalid") == 0


def test_tokens_the_doc_allows_are_accepted(standard, keys):
    """A token without `kid` (tried against each key of its algorithm), `aud` as an array
    holding the audience, `exp` just past but within the 30 s leeway, no `nbf`, a token of
    exactly 8 KiB, and scopes from `scp` (array or string) are all accepted."""
    base = claims("edge-cases")
    accepted = {
        "no-kid-es256": keys["ES256"].sign(claims("no-kid"), kid=None),
        "no-kid-eddsa": keys["EdDSA"].sign(claims("no-kid"), kid=None),
        "aud-array": token(keys, aud=["https://someone.else.example", AUDIENCE]),
        "exp-within-leeway": token(keys, exp_in=-10),
        "nbf-within-leeway": token(keys, nbf_in=10),
        "no-nbf": token(keys, nbf_in=None),
        "scp-array": token(keys, scope=None, scp=["other", "mcp"]),
        "scp-string": token(keys, scope=None, scp="mcp"),
        "scope-among-others": token(keys, scope="mcp:read mcp profile"),
        "exactly-8-KiB": authkit.token_of_length(keys["RS256"], base, AUTH_TOKEN_BYTES_MAX),
    }
    assert len(accepted["exactly-8-KiB"]) == AUTH_TOKEN_BYTES_MAX

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for case, tok in accepted.items():
                response = await post_initialize(client, standard.url, bearer(tok))
                assert response.status_code == 200, (case, response.status_code, response.headers, response.text[:300])
                assert response.headers.get("mcp-session-id"), case

    run(scenario)


# --- 2. no token ------------------------------------------------------------------------------


def test_no_token_is_challenged_with_the_metadata_url(gateways, keys, enc_key):
    """Without `auth.scopes`: 401 `Bearer resource_metadata="<prm>"`, the metadata URL built
    from the Host; POST, GET and DELETE alike, and for a non-Bearer credential."""
    gw = gateways({"jwt": jwt_block("jwks.json")}, files=standard_files(keys, enc_key))
    expected = f'Bearer resource_metadata="{gw.prm_url}"'
    assert gw.prm_url.startswith("http://127.0.0.1:") and gw.prm_url.endswith("/.well-known/oauth-protected-resource/mcp")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            assert_refusal(await post_initialize(client, gw.url), 401, expected)
            for credential in ("Basic YWxpY2U6c2VjcmV0", "Bearerish abc.def.ghi", "Token abc.def.ghi"):
                response = await post_initialize(client, gw.url, {"authorization": credential})
                assert_refusal(response, 401, expected)
            response = await client.get(gw.url, headers={"accept": "text/event-stream"})
            assert_refusal(response, 401, expected)
            response = await client.delete(gw.url, headers={"mcp-session-id": "whatever"})
            assert_refusal(response, 401, expected)

    run(scenario)
    assert gw.metric("mcpyard_auth_rejected_total", reason="missing") >= 3


def test_no_token_with_scopes_names_the_scope_first(standard):
    """With `auth.scopes: [mcp]`: 401 `Bearer scope="mcp", resource_metadata="<prm>"`."""

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            response = await post_initialize(client, standard.url)
            assert_refusal(response, 401, f'Bearer scope="mcp", resource_metadata="{standard.prm_url}"')

    run(scenario)


# --- 3. bad tokens ----------------------------------------------------------------------------


def bad_tokens(keys: dict[str, authkit.SigningKey], enc_key: authkit.SigningKey) -> dict[str, tuple[str, str | None]]:
    """case: (token, the phrase mcpyard must give; None: any of its phrases)."""
    rsa = keys["RS256"]
    stranger = authkit.new_key("RS256", rsa.kid)  # a key not in the set, a kid that is
    unknown = authkit.new_key("ES256", f"nobody-{uuid.uuid4().hex[:8]}")
    valid = token(keys, sub="mallory")
    head, _, rest = valid.partition(".")
    _, _, signature = rest.partition(".")
    tampered_payload = jwt.utils.base64url_encode(json.dumps(claims("root")).encode()).decode()
    rs384 = authkit.SigningKey(alg="RS384", kid=rsa.kid, private=rsa.private)
    return {
        "expired": (token(keys, "ES256", sub="mallory", exp_in=-120), "token expired"),
        "not-yet-valid": (token(keys, "EdDSA", sub="mallory", nbf_in=120), "token not yet valid"),
        "wrong-issuer": (token(keys, sub="mallory", iss="https://evil.example"), "wrong issuer"),
        "wrong-audience": (token(keys, sub="mallory", aud="https://other.example/mcp"), "wrong audience"),
        "wrong-audience-array": (token(keys, sub="mallory", aud=["https://a.example", "https://b.example"]), "wrong audience"),
        "forged-signature": (stranger.sign(claims("mallory")), "signature invalid"),
        "tampered-payload": (f"{head}.{tampered_payload}.{signature}", "signature invalid"),
        "unknown-kid": (unknown.sign(claims("mallory")), "unknown key"),
        "encryption-key": (enc_key.sign(claims("mallory")), "unknown key"),
        "hs256": (jwt.encode(claims("mallory"), "k" * 32, algorithm="HS256", headers={"kid": rsa.kid}), "algorithm not allowed"),
        # The doc forbids `none` but fixes no phrase for it (mcpyard: `malformed token`).
        "alg-none": (jwt.encode(claims("mallory"), None, algorithm="none"), None),
        "rs384-not-configured": (rs384.sign(claims("mallory")), "algorithm not allowed"),
        "garbage": ("abc.def", "malformed token"),
        "three-garbage-parts": ("abc.def.ghi", "malformed token"),
        "too-long-9000": (authkit.token_of_length(rsa, claims("mallory"), 9000), "token too long"),
        "too-long-by-one": (authkit.token_of_length(rsa, claims("mallory"), AUTH_TOKEN_BYTES_MAX + 1), "token too long"),
        "no-exp": (token(keys, sub="mallory", exp_in=None), None),
        # Sessions belong to their subject: a token that names none (or not as a string)
        # could otherwise use every other such token's sessions.
        "no-subject": (keys["ES256"].sign({k: v for k, v in claims("x").items() if k != "sub"}), "token without subject"),
        "empty-subject": (token(keys, sub=""), "token without subject"),
        "numeric-subject": (keys["EdDSA"].sign({**claims("x"), "sub": 42}), "token without subject"),
    }


BAD_TOKEN_CASES = [
    "expired", "not-yet-valid", "wrong-issuer", "wrong-audience", "wrong-audience-array", "forged-signature",
    "tampered-payload", "unknown-kid", "encryption-key", "hs256", "alg-none", "rs384-not-configured", "garbage",
    "three-garbage-parts", "too-long-9000", "too-long-by-one", "no-exp", "no-subject", "empty-subject",
    "numeric-subject",
]  # fmt: skip


@pytest.mark.parametrize("case", BAD_TOKEN_CASES)
def test_a_bad_token_is_refused_with_mcpyards_own_phrase(case, standard, keys, enc_key):
    """401 `Bearer error="invalid_token", error_description="<phrase>", resource_metadata=…`
    with the doc's phrase for each failure; nothing of the token comes back."""
    tok, phrase = bad_tokens(keys, enc_key)[case]

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            started = time.monotonic()
            response = await post_initialize(client, standard.url, bearer(tok))
            elapsed = time.monotonic() - started
            assert response.status_code == 401, (response.status_code, response.text[:300])
            if phrase is None:
                description = re.fullmatch(
                    r'Bearer error="invalid_token", error_description="([^"]*)", resource_metadata="(.*)"', challenge(response)
                )
                assert description and description.group(1) in PHRASES, challenge(response)
                assert description.group(2) == standard.prm_url
                assert_refusal(response, 401, challenge(response))
            else:
                assert_refusal(response, 401, invalid_token(phrase, standard.prm_url))
            everything = response.text + "".join(f"{k}:{v}" for k, v in response.headers.items())
            for part in tok.split("."):
                if len(part) > 3:
                    assert part not in everything, f"the token's {part[:20]}… was echoed"
            assert "mallory" not in everything
            # An unknown kid waits at most JWKS_UNKNOWN_KID_WAIT for a re-read; nothing else waits.
            assert elapsed < JWKS_UNKNOWN_KID_WAIT_S + 1.5, elapsed

    run(scenario)


def test_rejections_are_counted_by_reason(standard, keys):
    """`mcpyard_auth_rejected_total{reason}` counts expired tokens apart from other invalid
    ones, and missing ones apart from both."""
    before = {r: standard.metric("mcpyard_auth_rejected_total", reason=r) for r in ("missing", "invalid", "expired", "scope")}

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            assert (await post_initialize(client, standard.url)).status_code == 401
            assert (await post_initialize(client, standard.url, bearer(token(keys, exp_in=-300)))).status_code == 401
            assert (await post_initialize(client, standard.url, bearer(token(keys, iss="https://x.example")))).status_code == 401
            assert (await post_initialize(client, standard.url, bearer(token(keys, scope="nope")))).status_code == 403

    run(scenario)
    after = {r: standard.metric("mcpyard_auth_rejected_total", reason=r) for r in before}
    assert {r: after[r] - before[r] for r in after} == {"missing": 1, "invalid": 1, "expired": 1, "scope": 1}, after


def test_every_auth_metric_family_is_published_from_the_start(standard):
    """Each family docs/auth.md names is in the scrape (counters at 0 before any event),
    so dashboards and alerts can be written against them."""
    text = standard.metrics()
    for family in (
        "mcpyard_auth_rejected_total",
        "mcpyard_auth_verified_total",
        "mcpyard_auth_signature_checks_total",
        "mcpyard_auth_tokens_evicted_total",
        "mcpyard_rate_buckets_evicted_total",
        "mcpyard_jwks_reads_total",
        "mcpyard_rate_limited_total",
    ):
        assert f"# TYPE {family} counter" in text, family


def test_a_replayed_bad_token_costs_one_signature_check(standard, keys):
    """A forged signature (a key not in the set, with a kid that is) sent ten times: ten
    exact 401s, one signature check (`mcpyard_auth_signature_checks_total`); the worker
    remembers the refusal. A valid token after it is still checked and accepted."""
    stranger = authkit.new_key("RS256", keys["RS256"].kid)
    forged = stranger.sign(claims(f"replayer-{uuid.uuid4().hex[:8]}"))
    before = standard.metric("mcpyard_auth_signature_checks_total")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for _ in range(10):
                response = await post_initialize(client, standard.url, bearer(forged))
                assert_refusal(response, 401, invalid_token("signature invalid", standard.prm_url))
            ok = await post_initialize(client, standard.url, bearer(token(keys, sub=f"fresh-{uuid.uuid4().hex[:8]}")))
            assert ok.status_code == 200, ok.text

    run(scenario)
    assert standard.metric("mcpyard_auth_signature_checks_total") - before == 2


@pytest.mark.parametrize(
    "credential",
    [
        b"Bearer a\x00b",
        b"Bearer \x00",
        b"Bearer \xc3\xa9\xc3\xa9.\xc3\xa9.\xc3\xa9",
        b"Bearer \xff\xfe\xfd",
        b"Bearer eyJhbGciOiJSUzI1NiJ9.\x80\x81.abc",
        b"Bearer " + b"\xe2\x82\xac" * 3000,
    ],
    ids=["nul-inside", "nul-only", "utf8", "invalid-utf8", "high-bytes-in-a-jwt", "9000-non-ascii"],
)
def test_hostile_token_bytes_get_a_4xx_and_the_gateway_keeps_serving(credential, standard, keys):
    """A token holding a NUL or non-ASCII bytes, sent on a raw socket, is refused with a 4xx
    (never a crash, never a 2xx); a valid caller is served right after."""
    answer = raw_initialize(standard.url, credential)
    assert re.match(rb"HTTP/1\.1 4\d\d ", answer), answer[:300]
    hostile = credential[len(b"Bearer ") :]
    assert len(hostile) < 4 or hostile not in answer, "the token was echoed"
    if answer.startswith(b"HTTP/1.1 401 "):
        # Past the edge's header checks it is a token that fails a check, with a fixed phrase.
        found = re.search(rb'\r\nwww-authenticate: Bearer error="invalid_token", error_description="([^"]*)", ', answer, re.I)
        assert found and found.group(1).decode() in PHRASES, answer[:400]
    assert standard.child.alive(), standard.child.stderr()[-3000:]

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            await exercise_session(RawSession(client, standard.url, headers=bearer(token(keys, sub="after-hostile"))))

    run(scenario)


# --- 4. scope ---------------------------------------------------------------------------------


def test_a_valid_token_without_the_needed_scope_gets_403(standard, keys):
    """A token lacking `mcp` (other scopes, none at all, `scp` without it): 403 `Bearer
    error="insufficient_scope", scope="mcp", resource_metadata="<prm>"`."""
    expected = f'Bearer error="insufficient_scope", scope="mcp", resource_metadata="{standard.prm_url}"'
    lacking = {
        "other-scopes": token(keys, scope="mcp:read profile"),
        "prefix-is-not-the-scope": token(keys, scope="mcpx"),
        "no-scope-claim": token(keys, scope=None),
        "empty-scope": token(keys, scope=""),
        "scp-without-it": token(keys, "ES256", scope=None, scp=["read"]),
    }

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for case, tok in lacking.items():
                response = await post_initialize(client, standard.url, bearer(tok))
                assert response.status_code == 403, (case, response.status_code, response.text[:200])
                assert_refusal(response, 403, expected)

    run(scenario)


def test_a_session_loses_access_when_its_token_lacks_the_scope(standard, keys):
    """The scope is needed on every request, not only at initialize: a session opened with
    `mcp` is refused (403) on a request carrying a token of the same subject without it."""

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            session = RawSession(client, standard.url, headers=bearer(token(keys, sub="scoped")))
            await session.initialize()
            session.extra = bearer(token(keys, sub="scoped", scope="profile"))
            reply = await session.request("tools/list")
            assert reply.status == 403, reply.body
            assert reply.headers["www-authenticate"] == (
                f'Bearer error="insufficient_scope", scope="mcp", resource_metadata="{standard.prm_url}"'
            )

    run(scenario)


# --- 5. protected-resource metadata -----------------------------------------------------------


def prm_paths() -> list[str]:
    return [f"{WELL_KNOWN}/mcp", WELL_KNOWN]


def test_metadata_is_derived_from_the_host_without_a_resource(standard):
    """Both metadata paths answer 200 without a token: `resource` is scheme, Host and MCP
    path; `authorization_servers` defaults to `[jwt.issuer]`; other methods get 405."""
    expected = {
        "resource": standard.url,
        "authorization_servers": [ISSUER],
        "scopes_supported": ["mcp"],
        "bearer_methods_supported": ["header"],
    }

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for path in prm_paths():
                response = await client.get(f"{standard.origin}{path}")
                assert response.status_code == 200, (path, response.status_code, response.text[:300])
                assert response.headers["content-type"].startswith("application/json"), response.headers
                body = json.loads(response.text)
                assert body == expected, (path, body)
                assert list(body) == list(expected), f"member order: {list(body)}"
                for method in ("POST", "PUT", "DELETE"):
                    refused = await client.request(method, f"{standard.origin}{path}", content=b"{}")
                    assert refused.status_code == 405, (method, path, refused.status_code)
            # `localhost` as the Host: the resource follows it.
            host = standard.origin.split("//")[1].replace("127.0.0.1", "localhost")
            response = await client.get(f"{standard.origin}{WELL_KNOWN}/mcp", headers={"host": host})
            assert response.status_code == 200, response.text
            assert json.loads(response.text)["resource"] == f"http://{host}/mcp"

    run(scenario)


def test_a_configured_resource_is_returned_verbatim_and_names_the_challenge_host(gateways, keys, enc_key):
    """With `auth.resource`, the metadata's `resource` is that value, `scopes_supported` is
    `auth.scopes` then the rules' scopes without repeats, the configured
    `authorization_servers` are listed, the challenge URL is on the resource's host, and
    `jwt.audiences` defaults to `[resource]`."""
    auth = {
        "resource": AUDIENCE,
        "authorization_servers": ["https://login-a.test.example", "https://login-b.test.example/tenant"],
        "scopes": ["mcp"],
        "jwt": {"issuer": ISSUER, "jwks": "jwks.json"},
        "rules": [
            {"tools": ["*delete*"], "scopes": ["mcp:write", "mcp"]},
            {"tools": ["admin_*"], "scopes": ["mcp:admin", "mcp:write"]},
            {},
        ],
    }
    gw = gateways(auth, files=standard_files(keys, enc_key))
    prm_url = f"https://mcp.test.example{WELL_KNOWN}/mcp"
    expected = {
        "resource": AUDIENCE,
        "authorization_servers": ["https://login-a.test.example", "https://login-b.test.example/tenant"],
        "scopes_supported": ["mcp", "mcp:write", "mcp:admin"],
        "bearer_methods_supported": ["header"],
    }

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for path in prm_paths():
                response = await client.get(f"{gw.origin}{path}")
                assert response.status_code == 200, (path, response.status_code, response.text[:300])
                assert json.loads(response.text) == expected
            assert_refusal(await post_initialize(client, gw.url), 401, f'Bearer scope="mcp", resource_metadata="{prm_url}"')
            wrong = await post_initialize(client, gw.url, bearer(token(keys, aud="https://other.example/mcp")))
            assert_refusal(wrong, 401, invalid_token("wrong audience", prm_url))
            # aud = the resource: accepted though `audiences` is not set.
            await exercise_session(RawSession(client, gw.url, headers=bearer(token(keys, aud=AUDIENCE))))

    run(scenario)


# --- 6. sessions belong to their subject ------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES, ids=runtime_id)
def test_a_session_answers_only_its_own_subject(runtime, gateways, keys, enc_key):
    """Bob's valid token on Alice's session id gets exactly what an unknown session id gets
    (404), for POST, GET and DELETE; Alice's session is untouched and takes any valid token
    of hers."""
    gw = gateways(standard_auth(), runtime=runtime, files=standard_files(keys, enc_key))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            alice = RawSession(client, gw.url, headers=bearer(token(keys, "RS256", sub="alice")))
            await alice.initialize()
            bob_token = token(keys, "ES256", sub="bob")
            stolen = RawSession(client, gw.url, headers=bearer(bob_token))
            stolen.session_id = alice.session_id
            made_up = RawSession(client, gw.url, headers=bearer(bob_token))
            made_up.session_id = uuid.uuid4().hex

            on_alices = await stolen.request("tools/list", request_id=7)
            on_nothing = await made_up.request("tools/list", request_id=7)
            assert on_nothing.status == 404, on_nothing.body
            assert on_alices.status == 404, on_alices.body
            assert on_alices.body == on_nothing.body
            assert on_alices.headers.get("content-type") == on_nothing.headers.get("content-type")
            assert "www-authenticate" not in on_alices.headers

            call = await stolen.request("tools/call", {"name": "echo", "arguments": {"text": "as alice"}})
            assert call.status == 404, call.body
            get = await client.get(gw.url, headers={**stolen.headers(), "accept": "text/event-stream"})
            assert get.status_code == 404, get.text
            delete = await stolen.delete()
            assert delete.status_code == 404, delete.text

            # Alice's session still works, with the token that opened it and with another of hers.
            reply = await alice.request("tools/call", {"name": "echo", "arguments": {"text": "still mine"}})
            assert reply.status == 200 and reply.result["content"][0]["text"] == "still mine", reply.body
            alice.extra = bearer(token(keys, "EdDSA", sub="alice"))
            assert (await alice.request("ping")).status == 200
            ended = await alice.delete()
            assert ended.status_code in (200, 202, 204), ended.status_code

    run(scenario)
    assert gw.metric("mcpyard_auth_rejected_total", reason="subject") >= 4


# --- 7. the key set over https: rotation, refetch limits, no set yet --------------------------


@pytest.fixture
def jwks_server(tls_material):
    servers: list[authkit.JwksServer] = []

    def start(served: dict[str, Any]) -> authkit.JwksServer:
        server = authkit.JwksServer(tls_material.server.cert, tls_material.server.key, served).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


async def initialize_status(client: httpx2.AsyncClient, url: str, tok: str) -> httpx2.Response:
    return await post_initialize(client, url, bearer(tok))


def test_jwks_over_https_follows_key_rotation_and_limits_refetches(gateways, jwks_server, tls_material, keys):
    """The key set comes from an https URL trusted through `jwks_ca`. A token signed by key
    B, added to the served set after start, is accepted (its unknown kid makes mcpyard read
    the set again, the request waiting for it); a flood of tokens naming a kid that stays
    unknown is refused `unknown key` and causes at most a couple of reads in 10 s."""
    key_a = keys["RS256"]
    key_b = authkit.new_key("ES256", f"rotated-{uuid.uuid4().hex[:8]}")
    never = authkit.new_key("EdDSA", f"never-{uuid.uuid4().hex[:8]}")
    server = jwks_server(authkit.jwks(key_a))
    gw = gateways({"scopes": ["mcp"], "jwt": jwt_block(server.url, jwks_ca=str(tls_material.ca.pem))})
    assert server.wait_for_gets(1, TIMEOUT_S), "mcpyard never read the key set"

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            await exercise_session(RawSession(client, gw.url, headers=bearer(key_a.sign(claims("alice")))))
            refused = await initialize_status(client, gw.url, key_b.sign(claims("alice")))
            assert_refusal(refused, 401, invalid_token("unknown key", gw.prm_url))

            server.set_keys(authkit.jwks(key_a, key_b))
            # Out of any refetch interval the reads so far might have started.
            await anyio.sleep(max(0.0, server.gets[-1] + JWKS_REFETCH_INTERVAL_MIN_S + 0.5 - time.monotonic()))
            reads = len(server.gets)
            started = time.monotonic()
            accepted = await initialize_status(client, gw.url, key_b.sign(claims("bob")))
            waited = time.monotonic() - started
            assert accepted.status_code == 200, (accepted.status_code, accepted.headers, accepted.text[:300])
            assert waited < JWKS_UNKNOWN_KID_WAIT_S + 0.5, waited
            assert len(server.gets) == reads + 1, "the unknown kid must cause exactly one read"
            # Key A still works after the re-read.
            assert (await initialize_status(client, gw.url, key_a.sign(claims("carol")))).status_code == 200

            # A kid that stays unknown, again and again for 10 s: refused every time, read at most twice.
            reads = len(server.gets)
            flood_started = time.monotonic()
            answers: list[httpx2.Response] = []

            async def one() -> None:
                answers.append(await initialize_status(client, gw.url, never.sign(claims("mallory"))))

            while time.monotonic() - flood_started < JWKS_REFETCH_INTERVAL_MIN_S:
                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(one)
                await anyio.sleep(0.5)
            assert len(answers) >= 32  # 8 at a time, even if each waited the full 2 s
            for response in answers:
                assert_refusal(response, 401, invalid_token("unknown key", gw.prm_url))
            extra_reads = len(server.gets) - reads
            assert extra_reads <= 2, f"{extra_reads} reads of the key set for {len(answers)} unknown-kid requests in 10 s"

    run(scenario, timeout_s=60)
    assert gw.metric("mcpyard_jwks_reads_total", outcome="ok") >= 2
    assert gw.metric("mcpyard_jwks_reads_total", outcome="failed") == 0


def test_no_key_set_yet_is_503_then_a_failed_read_keeps_the_last_good_set(gateways, jwks_server, tls_material, keys):
    """While the JWKS URL has never answered, a token gets 503 with `Retry-After: 1` and no
    challenge; once it answers (re-read every `refresh`) tokens are accepted; when it fails
    again the last good set stays in use. Reads are counted by outcome."""
    key = keys["ES256"]
    server = jwks_server(authkit.jwks(key))
    server.set_failing(True)
    gw = gateways({"scopes": ["mcp"], "jwt": jwt_block(server.url, jwks_ca=str(tls_material.ca.pem), refresh="1s")})
    assert server.wait_for_gets(1, TIMEOUT_S), "mcpyard never tried the key set"
    tok = key.sign(claims("early"))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            response = await initialize_status(client, gw.url, tok)
            assert response.status_code == 503, (response.status_code, response.text[:300])
            assert response.headers.get("retry-after") == "1", response.headers
            assert "www-authenticate" not in response.headers, response.headers
            await anyio.to_thread.run_sync(lambda: gw.wait_metric("mcpyard_jwks_reads_total", 1, outcome="failed"))
            assert gw.metric("mcpyard_auth_rejected_total", reason="keys") >= 1

            server.set_failing(False)
            deadline = time.monotonic() + TIMEOUT_S
            while (response := await initialize_status(client, gw.url, tok)).status_code == 503:
                assert time.monotonic() < deadline, "the key set was never loaded after the URL answered"
                await anyio.sleep(0.1)
            assert response.status_code == 200, (response.status_code, response.text[:300])

            server.set_failing(True)
            failed_reads = len(server.gets)
            assert await anyio.to_thread.run_sync(server.wait_for_gets, failed_reads + 2, TIMEOUT_S)
            await exercise_session(RawSession(client, gw.url, headers=bearer(key.sign(claims("later")))))

    run(scenario)
    assert gw.metric("mcpyard_jwks_reads_total", outcome="ok") >= 1
    assert gw.metric("mcpyard_jwks_reads_total", outcome="failed") >= 2


def test_a_key_set_whose_keys_are_all_withdrawn_refuses_every_token(gateways, jwks_server, tls_material, keys):
    """The issuer withdraws every key (`{"keys":[]}`, as in an incident): the next read
    installs the empty set and tokens signed with the old key are refused with 401. (The
    empty set used to count as a failed read, and the withdrawn key stayed trusted.)"""
    key = keys["ES256"]
    server = jwks_server(authkit.jwks(key))
    gw = gateways({"scopes": ["mcp"], "jwt": jwt_block(server.url, jwks_ca=str(tls_material.ca.pem), refresh="1s")})
    tok = key.sign(claims("withdrawn"))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            deadline = time.monotonic() + TIMEOUT_S
            while (response := await initialize_status(client, gw.url, tok)).status_code == 503:
                assert time.monotonic() < deadline, "the key set was never loaded"
                await anyio.sleep(0.1)
            assert response.status_code == 200, (response.status_code, response.text[:300])
            server.set_keys({"keys": []})
            deadline = time.monotonic() + TIMEOUT_S
            while (response := await initialize_status(client, gw.url, key.sign(claims("after")))).status_code == 200:
                assert time.monotonic() < deadline, "the withdrawn key stayed trusted"
                await anyio.sleep(0.2)
            assert response.status_code == 401, (response.status_code, response.text[:300])
            assert response.headers["www-authenticate"].startswith("Bearer "), response.headers

    run(scenario)
    assert gw.metric("mcpyard_jwks_reads_total", outcome="failed") == 0


def test_no_key_set_from_a_url_that_never_answers(gateways, tls_material, keys):
    """A JWKS URL where nothing listens: mcpyard starts, and a token gets 503
    `Retry-After: 1` without `WWW-Authenticate`, with the JSON-RPC error body."""
    dead = harness.free_port()
    gw = gateways({"jwt": jwt_block(f"https://127.0.0.1:{dead}/jwks.json", jwks_ca=str(tls_material.ca.pem))})

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            response = await initialize_status(client, gw.url, token(keys))
            assert response.headers.get("retry-after") == "1", response.headers
            assert_refusal(response, 503, None)

    run(scenario)


# --- 8. rules ---------------------------------------------------------------------------------


RULES = [
    {"toolkit": "b", "groups": ["ops"]},
    {"tools": ["a__add"], "scopes": ["mcp:write"]},
    {},
]


async def lists(session: RawSession) -> dict[str, list[str]]:
    """Every list's names (tools, prompts) and URIs (resources, templates)."""
    out: dict[str, list[str]] = {}
    for method, member, key in (
        ("tools/list", "tools", "name"),
        ("prompts/list", "prompts", "name"),
        ("resources/list", "resources", "uri"),
        ("resources/templates/list", "resourceTemplates", "uriTemplate"),
    ):
        reply = await session.request(method)
        assert reply.status == 200, (method, reply.body)
        assert "nextCursor" not in reply.result
        out[member] = [item[key] for item in reply.result[member]]
    return out


async def call_error(session: RawSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    reply = await session.request(method, params)
    assert reply.status == 200, (method, params, reply.status, reply.body)
    return reply.error


@pytest.mark.parametrize("forward", [False, True], ids=["gateway-token-only", "token-forwarded"])
def test_an_upstream_challenge_reaches_an_authenticated_agent_only_about_its_own_token(forward, gateways, keys, enc_key):
    """mcpyard checks the agent's token itself; toolkit `a` is an upstream that answers a
    call with 401 and a challenge naming its own metadata. When the route does not forward
    the agent's token, the challenge is about a credential the agent never sent: it gets
    -32603, not a 401 that would send it to another authorization server. When the route
    forwards it, the upstream judged the agent's own token, and the challenge is relayed."""
    fault = FaultUpstream().start()
    try:
        forwarding = ", authorization: forward" if forward else ""
        a_exit = f'{{ kind: client, server: "{fault.url}"{forwarding} }}'
        gw = gateways(standard_auth(), files=standard_files(keys, enc_key), proxy=True, a_exit=a_exit)
        www = 'Bearer error="invalid_token", resource_metadata="https://elsewhere.example/prm"'

        async def scenario():
            async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
                session = RawSession(client, gw.url, headers=bearer(token(keys)))
                await session.initialize()
                fault.script("tools/call", fault_challenge(401, www))
                reply = await session.request("tools/call", {"name": "a__echo", "arguments": {"text": "x"}})
                if forward:
                    assert reply.status == 401, (reply.status, reply.body[:300])
                    assert reply.headers["www-authenticate"] == www, reply.headers
                else:
                    assert reply.status == 200, (reply.status, reply.body[:300])
                    assert "www-authenticate" not in reply.headers, reply.headers
                    assert reply.error == {"code": -32603, "message": "Upstream refused the request (HTTP 401)"}, reply.body
                # The session goes on.
                again = await session.request("tools/call", {"name": "a__echo", "arguments": {"text": "y"}})
                assert again.status == 200 and "result" in again.message, again.body[:300]

        run(scenario)
    finally:
        fault.close()


def test_under_rules_only_known_notifications_are_forwarded(gateways, keys, enc_key):
    """Under rules, a notification the gateway does not know names nothing a rule can judge:
    it is answered 400 with -32601 and not forwarded, as an unknown request method is.
    `roots/list_changed` and `progress` go on (202)."""
    gw = gateways(standard_auth(rules=[{}]), files=standard_files(keys, enc_key), proxy=True)

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            session = RawSession(client, gw.url, headers=bearer(token(keys)))
            await session.initialize()
            for known in ("notifications/roots/list_changed", "notifications/progress"):
                reply = await session.notify(known, {"progressToken": "p", "progress": 1} if known.endswith("progress") else None)
                assert reply.status == 202, (known, reply.status, reply.body)
            reply = await session.notify("notifications/vendor/anything", {"x": 1})
            assert reply.status == 400, (reply.status, reply.body)
            assert json.loads(reply.body)["error"]["code"] == -32601, reply.body

    run(scenario)


@pytest.fixture(scope="module")
def large_catalogue():
    """The bundled Rust fixture with 3,000 tools (`tool_00000`...): a list of about 300 KB,
    many times the 32 KiB a stream sends before its receiver acknowledges."""
    fixture = harness.ROOT / "target" / "release" / "mcpyard-loadgen"
    assert fixture.exists(), f"{fixture} is missing: cargo build --release --workspace builds it"
    proc = subprocess.Popen(
        [str(fixture), "upstream", "--listen", "127.0.0.1:0", "--tools", "3000", "--page-size", "500"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("listening "), f"fixture said {line!r}"
        yield f"http://{line.split()[1]}/mcp"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("cache", [False, True], ids=["live-lists", "cached-lists"])
def test_rules_filter_a_list_many_windows_long(cache, gateways, keys, enc_key, large_catalogue):
    """A rule hiding a third of a 3,000-tool toolkit (`a__tool_01*` for `ops` only): a
    caller outside `ops` gets the list without those, in order, as JSON and over SSE (a
    progress token), live and from the cache; a caller in `ops` gets all of it. The
    filtered answer is written a window at a time from the list it is cut from."""
    rules = [{"tools": ["a__tool_01*"], "groups": ["ops"]}, {}]
    a_exit = f'{{ kind: client, server: "{large_catalogue}", response_timeout: 10s }}'
    gw = gateways(standard_auth(rules=rules), files=standard_files(keys, enc_key), proxy=True, cache=cache, a_exit=a_exit)

    async def names(session: RawSession, progress: bool) -> list[str]:
        params = {"_meta": {"progressToken": "p"}} if progress else None
        reply = await session.request("tools/list", params)
        assert reply.status == 200, reply.body[:300]
        want_type = "text/event-stream" if progress else "application/json"
        assert reply.content_type == want_type, reply.headers
        assert len(reply.body) > 4 * 32 * 1024, len(reply.body)
        assert "nextCursor" not in reply.result
        return [t["name"] for t in reply.result["tools"]]

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            full = RawSession(client, gw.url, headers=bearer(token(keys, sub="root", groups=["ops"])))
            plain = RawSession(client, gw.url, headers=bearer(token(keys, "ES256", sub="guest", groups=["dev"])))
            for session in (full, plain):
                await session.initialize()
            everything = await names(full, False)
            generated = [n for n in everything if n.startswith("a__tool_")]
            first = int(generated[0].removeprefix("a__tool_"))
            assert generated == [f"a__tool_{n:05}" for n in range(first, first + len(generated))], everything[:5]
            assert len(generated) > 2900, len(generated)
            assert "b__echo" in everything
            visible = [n for n in everything if not n.startswith("a__tool_01")]
            assert len(everything) - len(visible) == 1000
            for progress in (False, True, False):
                assert await names(full, progress) == everything
                assert await names(plain, progress) == visible
            # The hidden ones are unknown to the guest.
            error = await call_error(plain, "tools/call", {"name": "a__tool_01234", "arguments": {}})
            assert error == {"code": INVALID_PARAMS, "message": "Unknown tool: a__tool_01234"}, error
        if cache:
            assert gw.metric("mcpyard_cache_hits_total") >= 6

    run(scenario, timeout_s=60)


@pytest.mark.parametrize("cache", [False, True], ids=["live-lists", "cached-lists"])
def test_rules_hide_and_refuse_what_a_caller_may_not_use(cache, gateways, keys, enc_key):
    """Rules `[{toolkit: b, groups: [ops]}, {tools: [a__add], scopes: [mcp:write]}, {}]`,
    first match decides: a caller with neither sees no `b` item and no `a__add`, and using
    them is answered as for a name nobody has; a caller in `ops` sees `b` but not `a__add`;
    a caller with both sees and uses everything."""
    gw = gateways(standard_auth(rules=RULES), files=standard_files(keys, enc_key), proxy=True, cache=cache)

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            full = RawSession(client, gw.url, headers=bearer(token(keys, sub="root", groups=["ops"], scope="mcp mcp:write")))
            ops = RawSession(client, gw.url, headers=bearer(token(keys, "ES256", sub="oper", groups=["ops", "dev"])))
            plain = RawSession(client, gw.url, headers=bearer(token(keys, "EdDSA", sub="guest", groups=["dev"])))
            for session in (full, ops, plain):
                await session.initialize()
            everything = await lists(full)
            tools = everything["tools"]
            assert {"a__echo", "a__add", "b__echo", "b__add"} <= set(tools), tools
            assert everything["prompts"] == ["a__greet", "b__greet"]
            assert {"a+demo://readme", "b+demo://readme", "b+demo://status"} <= set(everything["resources"])
            assert everything["resourceTemplates"] == ["a+demo://items/{id}", "b+demo://items/{id}"]

            def without(names: list[str], hidden) -> list[str]:
                return [n for n in names if not hidden(n)]

            for session, hidden in (
                (plain, lambda n: n.startswith(("b__", "b+")) or n == "a__add"),
                (ops, lambda n: n == "a__add"),
            ):
                seen = await lists(session)
                assert seen == {kind: without(names, hidden) for kind, names in everything.items()}, seen

            # Hidden items are unknown ones: the same errors as for names of a toolkit nobody has.
            unknown_tool = await call_error(plain, "tools/call", {"name": "zz__nothing", "arguments": {}})
            assert unknown_tool == {"code": INVALID_PARAMS, "message": "Unknown tool: zz__nothing"}, unknown_tool
            unknown_prompt = await call_error(plain, "prompts/get", {"name": "zz__greet"})
            assert unknown_prompt == {"code": INVALID_PARAMS, "message": "Unknown prompt: zz__greet"}, unknown_prompt
            unknown_resource = await call_error(plain, "resources/read", {"uri": "zz+demo://readme"})
            for session, name in ((plain, "b__echo"), (plain, "a__add"), (ops, "a__add")):
                error = await call_error(session, "tools/call", {"name": name, "arguments": {"text": "x", "a": 1, "b": 2}})
                assert error == {"code": INVALID_PARAMS, "message": f"Unknown tool: {name}"}, (name, error)
            error = await call_error(plain, "prompts/get", {"name": "b__greet", "arguments": {"name": "Ada"}})
            assert error == {"code": INVALID_PARAMS, "message": "Unknown prompt: b__greet"}, error
            assert unknown_resource == {"code": RESOURCE_NOT_FOUND, "message": "Resource not found"}, unknown_resource
            error = await call_error(plain, "resources/read", {"uri": "b+demo://readme"})
            assert error == unknown_resource, error
            error = await call_error(plain, "resources/subscribe", {"uri": "b+demo://status"})
            assert error == unknown_resource, error

            # What each may use works.
            for session in (plain, ops, full):
                reply = await session.request("tools/call", {"name": "a__echo", "arguments": {"text": "open to all"}})
                assert reply.result["content"] == [{"type": "text", "text": "open to all"}]
            for session in (ops, full):
                reply = await session.request("tools/call", {"name": "b__echo", "arguments": {"text": "ops only"}})
                assert reply.result["content"] == [{"type": "text", "text": "ops only"}]
            reply = await full.request("tools/call", {"name": "a__add", "arguments": {"a": 2, "b": 3}})
            assert reply.result["structuredContent"] == {"sum": 5}, reply.body
            reply = await ops.request("prompts/get", {"name": "b__greet", "arguments": {"name": "Ada"}})
            assert reply.status == 200 and "result" in reply.message, reply.body

    run(scenario)


def test_rules_filter_what_the_sdk_client_sees(gateways, keys, enc_key):
    """The same rules through the SDK (live lists): the guest's tool list has no `b__*` and
    no `a__add`, and calling `b__echo` raises the unknown-tool error."""
    from mcp.shared.exceptions import MCPError

    gw = gateways(standard_auth(rules=RULES), files=standard_files(keys, enc_key), proxy=True)

    async def scenario():
        async with connect(gw.url, headers=bearer(token(keys, sub="guest"))) as (session, _, _):
            names = [t.name for t in (await session.list_tools()).tools]
            assert "a__echo" in names and "a__add" not in names, names
            assert not [n for n in names if n.startswith("b__")], names
            with pytest.raises(MCPError) as raised:
                await session.call_tool("b__echo", {"text": "x"})
            assert raised.value.error.code == INVALID_PARAMS
            assert raised.value.error.message == "Unknown tool: b__echo"

    run(scenario)


# --- 9. rate limits ---------------------------------------------------------------------------


def rate_limited_body(request_id: Any, limit: str, retry_after: int) -> str:
    return (
        f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"error":{{"code":{RATE_LIMITED},"message":"Rate limit exceeded",'
        f'"data":{{"limit":"{limit}","retryAfter":{retry_after}}}}}}}'
    )


def assert_rate_limited(reply, request_id: Any, limit: str) -> int:
    """429, `Retry-After` an integer ≥ 1, the doc's body with the request's own id; returns
    the Retry-After seconds."""
    assert reply.status == 429, (reply.status, reply.body[:300])
    retry_after = reply.headers.get("retry-after")
    assert retry_after is not None and re.fullmatch(r"[1-9][0-9]*", retry_after), reply.headers
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    assert reply.body == rate_limited_body(request_id, limit, int(retry_after)), reply.body
    return int(retry_after)


CALLS = [{"name": "calls", "rate": "2/s", "burst": 3}]


def test_a_caller_over_its_rate_gets_429_and_others_do_not(gateways, keys, enc_key):
    """`{name: calls, rate: 2/s, burst: 3}`: the 4th quick request of a caller is refused
    (429, `Retry-After: 1`, the doc's body echoing the request's id); notifications never
    count; another subject has its own bucket; after Retry-After seconds the caller is
    served again; `mcpyard_rate_limited_total{limit="calls"}` counts the refusals."""
    gw = gateways(standard_auth(limits=CALLS), files=standard_files(keys, enc_key))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            alice = RawSession(client, gw.url, headers=bearer(token(keys, sub="alice")))
            await alice.initialize()  # 1
            assert (await alice.request("tools/list")).status == 200  # 2
            assert (await alice.request("tools/call", {"name": "echo", "arguments": {"text": "3"}})).status == 200  # 3
            retry_after = assert_rate_limited(await alice.request("tools/list", request_id="fourth"), "fourth", "calls")
            assert retry_after == 1  # a token comes back every 0.5 s
            call = {"name": "echo", "arguments": {"text": "5"}}
            assert_rate_limited(await alice.request("tools/call", call, request_id=77), 77, "calls")
            note = await alice.notify("notifications/cancelled", {"requestId": 12345, "reason": "test"})
            assert note.status == 202, note.body

            bob = RawSession(client, gw.url, headers=bearer(token(keys, "EdDSA", sub="bob")))
            await bob.initialize()
            assert (await bob.request("tools/list")).status == 200
            assert (await bob.request("tools/call", {"name": "echo", "arguments": {"text": "bob"}})).status == 200

            await anyio.sleep(retry_after)
            reply = await alice.request("tools/call", {"name": "echo", "arguments": {"text": "again"}})
            assert reply.status == 200 and reply.result["content"][0]["text"] == "again", reply.body

    run(scenario)
    assert gw.metric("mcpyard_rate_limited_total", limit="calls") == 2


def test_a_limit_holds_under_load_from_the_bundled_generator(gateways, keys, enc_key, tmp_path):
    """`{name: calls, rate: 100/s, burst: 50}` and mcpyard-loadgen (`--header` carrying the
    token) calling `echo` closed loop on 4 connections for 2 s, far past the rate: what got
    through is at least the burst and never more than rate × elapsed time + burst (+ the
    generator's two session setups); the rest was refused with 429 and counted."""
    loadgen = harness.ROOT / "target" / "release" / "mcpyard-loadgen"
    assert loadgen.exists(), f"{loadgen} is missing: cargo build --release --workspace builds it"
    limits = [{"name": "calls", "rate": "100/s", "burst": 50}]
    gw = gateways(standard_auth(limits=limits), files=standard_files(keys, enc_key))
    ok_series = ("mcpyard_request_seconds_count", {"method": "tools/call", "outcome": "ok"})
    served_before = gw.metric(ok_series[0], **ok_series[1])
    started = time.monotonic()
    run_ = subprocess.run(
        [str(loadgen), "run", "--url", gw.url, "--scenario", "tools-call", "--tool", "echo",
         "--mode", "closed", "--connections", "4", "--duration", "2s", "--warmup", "0s",
         "--timeout", "5s", "--header", f"authorization: Bearer {token(keys, sub='loaded')}",
         "--json", str(tmp_path / "load.json")],
        capture_output=True, text=True, timeout=60,
    )
    elapsed = time.monotonic() - started
    assert run_.returncode in (0, 1), run_.stderr[-2000:]
    served = gw.metric(ok_series[0], **ok_series[1]) - served_before
    refused = gw.metric("mcpyard_rate_limited_total", limit="calls")
    assert served >= 50, (served, refused)
    assert served <= 100 * elapsed + 50 + 2, (served, elapsed)
    assert refused > served, (served, refused)
    report = json.loads((tmp_path / "load.json").read_text())
    assert sum(report["errors"].values()) >= refused * 0.9, report["errors"]


def test_a_limit_without_tools_counts_every_request_but_ping(gateways, keys, enc_key):
    """A limit without `tools` counts every JSON-RPC request but `ping` (the gateway answers
    it itself, and a refused keep-alive would only break a client): initialize and two
    lists use up a burst of 3, any number of pings still pass, and the third list is
    refused with 429."""
    gw = gateways(standard_auth(limits=CALLS), files=standard_files(keys, enc_key))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            alice = RawSession(client, gw.url, headers=bearer(token(keys, sub="alice")))
            await alice.initialize()  # 1
            assert (await alice.request("tools/list")).status == 200  # 2
            for _ in range(8):
                assert (await alice.request("ping")).status == 200  # not counted
            assert (await alice.request("tools/list")).status == 200  # 3
            assert_rate_limited(await alice.request("tools/list", request_id="fourth"), "fourth", "calls")

    run(scenario)
    assert gw.metric("mcpyard_rate_limited_total", limit="calls") == 1


def test_a_tools_limit_counts_only_calls_of_those_tools(gateways, keys, enc_key):
    """`{name: echoes, tools: [echo], rate: 2/s, burst: 2}`: lists, pings and other tools
    never count; the 3rd quick `echo` call is refused with limit `echoes`; another caller
    still calls echo."""
    limits = [{"name": "echoes", "tools": ["echo"], "per": "sub", "rate": "2/s", "burst": 2}]
    gw = gateways(standard_auth(limits=limits), files=standard_files(keys, enc_key))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            alice = RawSession(client, gw.url, headers=bearer(token(keys, sub="alice")))
            await alice.initialize()
            for _ in range(4):
                assert (await alice.request("tools/list")).status == 200
                assert (await alice.request("ping")).status == 200
            for _ in range(2):
                reply = await alice.request("tools/call", {"name": "echo", "arguments": {"text": "e"}})
                assert reply.status == 200, reply.body
            refused = await alice.request("tools/call", {"name": "echo", "arguments": {"text": "e"}}, request_id="third-echo")
            assert_rate_limited(refused, "third-echo", "echoes")
            added = await alice.request("tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}})
            assert added.status == 200 and added.result["structuredContent"] == {"sum": 2}, added.body

            bob = RawSession(client, gw.url, headers=bearer(token(keys, sub="bob")))
            await bob.initialize()
            reply = await bob.request("tools/call", {"name": "echo", "arguments": {"text": "bob"}})
            assert reply.status == 200, reply.body

    run(scenario)
    assert gw.metric("mcpyard_rate_limited_total", limit="echoes") == 1


def test_a_limit_per_claim_shares_buckets_by_that_claim(gateways, keys, enc_key):
    """`per: tenant`: callers with the same `tenant` share one bucket, another tenant has its
    own, and callers without the claim share the bucket of callers without it."""
    limits = [{"name": "tenants", "per": "tenant", "rate": "1/m", "burst": 2}]
    gw = gateways(standard_auth(limits=limits), files=standard_files(keys, enc_key))

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:

            def caller(sub: str, **extra: Any) -> RawSession:
                return RawSession(client, gw.url, headers=bearer(keys["ES256"].sign(claims(sub, **extra))))

            alice, bob, carol = caller("alice", tenant="t1"), caller("bob", tenant="t1"), caller("carol", tenant="t2")
            await alice.initialize()  # t1: 1
            await bob.initialize()  # t1: 2
            refused = await bob.request("tools/list", request_id="t1-third")
            retry_after = assert_rate_limited(refused, "t1-third", "tenants")
            assert 1 <= retry_after <= 60, retry_after  # one request a minute
            assert_rate_limited(await alice.request("tools/list", request_id=3), 3, "tenants")
            await carol.initialize()
            assert (await carol.request("tools/list")).status == 200

            dave, erin = caller("dave"), caller("erin")
            await dave.initialize()  # no tenant: 1
            await erin.initialize()  # no tenant: 2
            assert_rate_limited(await dave.request("tools/list", request_id="untenanted"), "untenanted", "tenants")

    run(scenario)
    assert gw.metric("mcpyard_rate_limited_total", limit="tenants") == 3


# --- 10. OAuth discovery with the SDK ---------------------------------------------------------


@dataclass
class MemoryTokenStorage:
    """The SDK's TokenStorage, in memory."""

    tokens: OAuthToken | None = None
    client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


@dataclass
class HeadlessBrowser:
    """The SDK's redirect and callback handlers without a browser: the authorization URL is
    fetched with httpx and the redirect's code and state handed back."""

    visited: list[str] = field(default_factory=list)
    pending: list[AuthorizationCodeResult] = field(default_factory=list)

    async def redirect(self, url: str) -> None:
        self.visited.append(url)
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            response = await client.get(url)
        assert response.status_code == 302, (response.status_code, response.text)
        query = parse_qs(urlsplit(response.headers["location"]).query)
        self.pending.append(AuthorizationCodeResult(code=query["code"][0], state=query["state"][0]))

    async def callback(self) -> AuthorizationCodeResult:
        return self.pending.pop()


@pytest.fixture
def auth_server(keys):
    server = authkit.AuthServer(keys["EdDSA"], audience=AUDIENCE).start()
    yield server
    server.close()


def test_the_sdk_discovers_the_authorization_server_and_gets_in(gateways, auth_server, keys, enc_key):
    """The official SDK's OAuthClientProvider, with no token to begin with: mcpyard's 401
    names the metadata URL, the SDK reads the metadata, the authorization server's metadata,
    registers, authorizes (PKCE), gets a JWT for the configured audience, and the session
    works with it."""
    auth = {
        "authorization_servers": [auth_server.url],
        "scopes": ["mcp"],
        "jwt": {"issuer": auth_server.url, "audiences": [AUDIENCE], "jwks": "jwks.json"},
    }
    gw = gateways(auth, files=standard_files(keys, enc_key))
    storage = MemoryTokenStorage()
    browser = HeadlessBrowser()
    exchanges: list[tuple[str, str, int]] = []

    async def record(response: httpx2.Response) -> None:
        exchanges.append((response.request.method, str(response.request.url), response.status_code))

    provider = OAuthClientProvider(
        server_url=gw.url,
        client_metadata=OAuthClientMetadata(
            client_name="mcpyard auth test",
            redirect_uris=["http://127.0.0.1:1/callback"],
            grant_types=["authorization_code"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser.redirect,
        callback_handler=browser.callback,
    )

    async def scenario():
        async with httpx2.AsyncClient(auth=provider, timeout=TIMEOUT_S, event_hooks={"response": [record]}) as client:
            async with streamable_http_client(gw.url, http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    with anyio.fail_after(TIMEOUT_S):
                        init = await session.initialize()
                    assert init.server_info.name == "mcpyard"
                    tools = await session.list_tools()
                    assert "echo" in [t.name for t in tools.tools]
                    result = await session.call_tool("echo", {"text": "through OAuth"})
                    assert tool_text(result) == "through OAuth"

    run(scenario)
    assert exchanges[0] == ("POST", gw.url, 401), exchanges
    assert exchanges[1] == ("GET", gw.prm_url, 200), exchanges
    assert auth_server.seen[:4] == [
        "GET /.well-known/oauth-authorization-server",
        "POST /register",
        "GET /authorize",
        "POST /token",
    ], auth_server.seen
    assert len(browser.visited) == 1
    asked = parse_qs(urlsplit(browser.visited[0]).query)
    assert asked["scope"] == ["mcp"], asked  # from the challenge's scope="mcp"
    assert asked["resource"] == [gw.url], asked  # the metadata's resource
    assert auth_server.resources == [gw.url]
    assert storage.tokens is not None and storage.tokens.access_token == auth_server.issued[0]
    granted = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
    assert granted["aud"] == AUDIENCE and granted["iss"] == auth_server.url and granted["sub"] == "oauth-user"
    # Every MCP request after the token arrived carried it and was accepted.
    after = exchanges[exchanges.index(("POST", f"{auth_server.url}/token", 200)) + 1 :]
    assert after and all(status < 400 for method, url, status in after if url == gw.url), after


# --- configuration ----------------------------------------------------------------------------


def check(config: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "check.yaml"
    path.write_text(config)
    return subprocess.run(
        [str(harness.BINARY), "check", "--config", str(path)], capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_auth_config_errors_are_refused_by_check(tmp_path, keys, enc_key):
    """`mcpyard check` accepts the standard auth block and refuses ones the doc rules out,
    naming the offending key: a missing JWKS file, `leeway` over 5 min, an HMAC algorithm,
    `refresh` under 1 s, more than 64 rules, more than 16 limits, a malformed rate."""
    (tmp_path / "jwks.json").write_text(json.dumps(standard_files(keys, enc_key)["jwks.json"]))

    def config(auth: dict[str, Any]) -> str:
        return gateway_config(auth, runtime=(1, "epoll"), metrics_port=0)

    good = check(config(standard_auth(rules=RULES[1:], limits=[{"name": "calls", "rate": "20/s", "burst": 40}])), tmp_path)
    assert good.returncode == 0, good.stderr
    cases = {
        "jwks": standard_auth(jwt=jwt_block("missing.json")),
        "leeway": standard_auth(jwt=jwt_block("jwks.json", leeway="10m")),
        "algorithms": standard_auth(jwt=jwt_block("jwks.json", algorithms=["HS256"])),
        "refresh": standard_auth(jwt=jwt_block("jwks.json", refresh="500ms")),
        "rules": standard_auth(rules=[{"tools": [f"t{n}"]} for n in range(65)]),
        "limits": standard_auth(limits=[{"name": f"l{n}", "rate": "1/s"} for n in range(17)]),
        "rate": standard_auth(limits=[{"name": "calls", "rate": "fast"}]),
    }
    for key, auth in cases.items():
        done = check(config(auth), tmp_path)
        assert done.returncode != 0, (key, done.stdout)
        assert key in done.stderr, (key, done.stderr)
