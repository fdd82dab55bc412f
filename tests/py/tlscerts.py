"""Certificates made at test time with `cryptography`: a CA and leaves it signs (valid,
for the wrong name, expired), and a second CA nobody trusts. PEM files in a directory."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAY = datetime.timedelta(days=1)


@dataclass
class Leaf:
    cert: Path
    key: Path


class Ca:
    """A CA in `directory` (`<name>.pem`); `leaf()` writes certificates it signs."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"mcpyard test {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(now + 30 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip
        self.pem = directory / f"{name}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def leaf(self, file: str, names: list[str], *, expired: bool = False, client: bool = False) -> Leaf:
        """A server certificate for `names` (DNS names or IP addresses); with `client`, a
        client certificate instead."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        before, after = (now - 400 * DAY, now - 30 * DAY) if expired else (now - DAY, now + 30 * DAY)
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(before)
            .not_valid_after(after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        out = Leaf(cert=self.directory / f"{file}.pem", key=self.directory / f"{file}.key")
        out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return out


@dataclass
class Material:
    """What the TLS tests use: `ca` signs `server` (localhost, 127.0.0.1), `wrong_name`
    (elsewhere.example) and `expired`; `stranger` is a CA nobody is told to trust, and
    `untrusted` a server certificate it signed."""

    ca: Ca
    server: Leaf
    wrong_name: Leaf
    expired: Leaf
    stranger: Ca
    untrusted: Leaf


def make(directory: Path) -> Material:
    ca = Ca(directory, "ca")
    stranger = Ca(directory, "stranger")
    return Material(
        ca=ca,
        server=ca.leaf("server", ["localhost", "127.0.0.1"]),
        wrong_name=ca.leaf("wrong-name", ["elsewhere.example"]),
        expired=ca.leaf("expired", ["localhost", "127.0.0.1"], expired=True),
        stranger=stranger,
        untrusted=stranger.leaf("untrusted", ["localhost", "127.0.0.1"]),
    )
