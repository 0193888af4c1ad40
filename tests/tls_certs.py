"""Test certificates made with ``cryptography``: a CA, a server certificate for loopback, a client certificate, and
the bad ones a user may hand the sidecar (expired, another key's, not PEM)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = dt.datetime.now(dt.timezone.utc)
LOOPBACK_NAMES = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                  x509.IPAddress(ipaddress.ip_address("127.0.0.2"))]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed neither
    other_client_cert: Path  # a client certificate the other CA signed
    other_client_key: Path
    expired_cert: Path  # the server key's, expired yesterday
    not_pem: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer: str, issuer_key, ca: bool = False, san: list | None = None,
          usage=None, days: tuple[int, int] = (-1, 30)) -> x509.Certificate:
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(NOW + dt.timedelta(days=days[0])).not_valid_after(NOW + dt.timedelta(days=days[1]))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path: Path, obj) -> Path:
    if isinstance(obj, x509.Certificate):
        path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return path


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = _key(), _key()
    ca = _cert("poolpipe test CA", ca_key, "poolpipe test CA", ca_key, ca=True)
    other = _cert("another CA", other_key, "another CA", other_key, ca=True)
    server_key, client_key, other_client_key = _key(), _key(), _key()
    server = _cert("localhost", server_key, "poolpipe test CA", ca_key, san=LOOPBACK_NAMES,
                   usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = _cert("client", client_key, "poolpipe test CA", ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    other_client = _cert("stranger", other_client_key, "another CA", other_key,
                         usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    expired = _cert("localhost", server_key, "poolpipe test CA", ca_key, san=LOOPBACK_NAMES, days=(-30, -1))
    (d / "not.pem").write_text("this is not a certificate\n")
    return Certs(_write(d / "ca.pem", ca), _write(d / "server.pem", server), _write(d / "server.key", server_key),
                 _write(d / "client.pem", client), _write(d / "client.key", client_key),
                 _write(d / "other_ca.pem", other), _write(d / "stranger.pem", other_client),
                 _write(d / "stranger.key", other_client_key), _write(d / "expired.pem", expired), d / "not.pem")
