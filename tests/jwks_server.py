"""A JSON Web Key Set served on loopback, and tokens signed by its keys (for the JWT tests)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


class SigningKey:
    def __init__(self, kid: str, kind: str = "EC") -> None:
        self.kid = kid
        if kind == "RSA":
            self.private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.algorithm = "RS256"
            self.jwk = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            self.algorithm = "ES256"
            self.jwk = ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.jwk.update(kid=kid, use="sig", alg=self.algorithm)

    def token(self, *, kid: str | None = None, lifetime: float = 300, not_before: float | None = None, **claims) -> str:
        now = time.time()
        payload = {
            "iss": "https://issuer.test",
            "aud": "trio-direct",
            "iat": int(now),
            "exp": int(now + lifetime),
            **claims,
        }
        if not_before is not None:
            payload["nbf"] = int(now + not_before)
        return jwt.encode(payload, self.private, algorithm=self.algorithm, headers={"kid": kid or self.kid})


class JwksServer:
    """GET / answers {"keys": [...]} with the public keys in `keys`; `fetches` counts the GETs."""

    def __init__(self) -> None:
        self.keys: list[SigningKey] = []
        self.fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.fetches += 1
                body = json.dumps({"keys": [key.jwk for key in server.keys]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/jwks.json"

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()
