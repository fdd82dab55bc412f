"""A signing key, its JWK Set and one bearer token for the perf runs of `auth:` (RS256).

Only the standard library and the `openssl` command line: the perf scripts run with the
system python3, without the test venv. The key is made fresh in `RAW` for each run.
"""

import base64
import json
import os
import subprocess
import time


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make(directory, issuer="mcpyard-perf", audience="mcpyard-perf", subject="perf"):
    """Writes `jwks.json` into `directory`; returns (jwks path, token, auth YAML text)."""
    key = os.path.join(directory, "auth-key.pem")
    subprocess.run(["openssl", "genrsa", "-out", key, "2048"], check=True, capture_output=True)
    modulus = subprocess.run(["openssl", "rsa", "-in", key, "-noout", "-modulus"], check=True,
                             capture_output=True, text=True).stdout.strip().split("=", 1)[1]
    jwk = {"kty": "RSA", "kid": "perf", "use": "sig", "alg": "RS256",
           "n": b64url(bytes.fromhex(modulus)), "e": b64url((65537).to_bytes(3, "big"))}
    jwks = os.path.join(directory, "jwks.json")
    with open(jwks, "w") as f:
        json.dump({"keys": [jwk]}, f)
    header = b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "perf"}).encode())
    claims = {"iss": issuer, "aud": audience, "sub": subject, "scope": "mcp",
              "exp": int(time.time()) + 24 * 3600}
    signing_input = f"{header}.{b64url(json.dumps(claims).encode())}"
    signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key],
                               input=signing_input.encode(), check=True, capture_output=True).stdout
    token = f"{signing_input}.{b64url(signature)}"
    yaml = (f"auth: {{ scopes: [mcp], jwt: {{ issuer: {issuer}, audiences: [{audience}], "
            f"jwks: {jwks} }} }}")
    return jwks, token, yaml
