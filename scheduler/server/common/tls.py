"""TLS for the sidecar's ports and for its calls to the pass-through Triton.

The server side takes tritonserver's flags and meaning (``--grpc-use-ssl``, ``--grpc-server-cert``,
``--grpc-server-key``, ``--grpc-root-cert``, ``--grpc-use-ssl-mutual``, which implies ``--grpc-use-ssl``), and the
HTTP port the same under ``--http-*``. Every file is read and checked once at start (PEM, dates, key against
certificate), so a bad one is a one-line InputError, never a traceback from inside grpc or ssl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from poolpipe_common.errors import InputError

log = logging.getLogger("poolpipe.sidecar")
_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _read(path: Path, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None


def load_certificates(path: Path, flag: str, now: dt.datetime | None = None) -> list[x509.Certificate]:
    """The PEM certificates in ``path``, each valid now; else an InputError naming the flag and what is wrong."""
    data = _read(path, flag)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise InputError(f"{flag} {path}: not a PEM certificate (expected '-----BEGIN CERTIFICATE-----')") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    for c in certs:
        subject = c.subject.rfc4514_string() or "(no subject)"
        if c.not_valid_after_utc < now:
            raise InputError(f"{flag} {path}: the certificate {subject} expired on "
                             f"{c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if c.not_valid_before_utc > now:
            raise InputError(f"{flag} {path}: the certificate {subject} is not valid before "
                             f"{c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    return certs


def check_key_pair(cert_path: Path, key_path: Path, cert_flag: str, key_flag: str) -> None:
    """The certificate chain loads, is valid now, and its first certificate is the key's."""
    cert = load_certificates(cert_path, cert_flag)[0]
    data = _read(key_path, key_flag)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        why = "it is encrypted (give an unencrypted key)" if isinstance(e, TypeError) else \
            "not a PEM private key (expected '-----BEGIN ... PRIVATE KEY-----')"
        raise InputError(f"{key_flag} {key_path}: {why}") from None
    if key.public_key().public_bytes(*_SPKI) != cert.public_key().public_bytes(*_SPKI):
        raise InputError(f"{key_flag} {key_path} does not match {cert_flag} {cert_path} (the certificate is "
                         "another key's)")


@dataclass(frozen=True)
class ServerTls:
    """One port's TLS, as tritonserver's ``--<prefix>-*`` flags give it; ``mutual``: clients must present a
    certificate signed by ``root``."""

    cert: Path
    key: Path
    root: Path | None = None
    mutual: bool = False
    prefix: str = "--grpc"  # the flags' prefix, for errors

    def check(self) -> None:
        p = self.prefix
        check_key_pair(self.cert, self.key, f"{p}-server-cert", f"{p}-server-key")
        if self.root is not None:
            load_certificates(self.root, f"{p}-root-cert")
        self.ssl_context()  # what ssl itself would refuse (an unsupported key type), in one line too

    def grpc_credentials(self) -> grpc.ServerCredentials:
        root = _read(self.root, f"{self.prefix}-root-cert") if self.root is not None else None
        pair = (_read(self.key, f"{self.prefix}-server-key"), _read(self.cert, f"{self.prefix}-server-cert"))
        return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=self.mutual)

    def ssl_context(self) -> ssl.SSLContext:
        # a bare server context: under mutual TLS only --*-root-cert signs acceptable clients (a default context
        # would also trust every CA of the system's store)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.root is not None:
                ctx.load_verify_locations(cafile=str(self.root))
        except (ssl.SSLError, OSError) as e:
            raise InputError(f"{self.prefix}-server-cert {self.cert}: TLS cannot use it ({e})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE
        return ctx

    def triton_args(self) -> tuple[str, ...]:
        """The same settings as tritonserver's own flags (the native front end's tritonserver takes them)."""
        args = [f"{self.prefix}-use-ssl=true", f"{self.prefix}-server-cert={self.cert}",
                f"{self.prefix}-server-key={self.key}"]
        if self.root is not None:
            args.append(f"{self.prefix}-root-cert={self.root}")
        if self.mutual:
            args.append(f"{self.prefix}-use-ssl-mutual=true")
        return tuple(args)


@dataclass(frozen=True)
class ClientTls:
    """TLS on a channel the sidecar opens (to the pass-through Triton): the roots that sign the server's
    certificate (None: the system's), and the sidecar's own certificate where the server asks for one."""

    root: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    prefix: str = "--passthrough"

    @property
    def mutual(self) -> bool:
        """The sidecar presents a certificate of its own."""
        return self.cert is not None

    def check(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InputError(f"{self.prefix}-client-cert and {self.prefix}-client-key go together")
        if self.cert is not None:
            check_key_pair(self.cert, self.key, f"{self.prefix}-client-cert", f"{self.prefix}-client-key")
        if self.root is not None:
            load_certificates(self.root, f"{self.prefix}-root-cert")

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None, what: str) -> bytes | None:
            return None if path is None else _read(path, f"{self.prefix}-{what}")
        return grpc.ssl_channel_credentials(read(self.root, "root-cert"), read(self.key, "client-key"),
                                            read(self.cert, "client-cert"))


@dataclass(frozen=True)
class TlsSettings:
    """What ``poolpipe serve``'s TLS flags set: each port's TLS (None: plaintext) and the pass-through channel's."""

    grpc: ServerTls | None = None
    http: ServerTls | None = None
    passthrough: ClientTls | None = None
    stage: ClientTls | None = None  # the stage calls to the planned models' tritonservers (gRPC)

    def check(self) -> None:
        for part in (self.grpc, self.http, self.passthrough, self.stage):
            if part is not None:
                part.check()

    def plaintext_ports(self) -> list[str]:
        """The client-facing ports that take TLS but run without it."""
        return [name for name, part in (("grpc", self.grpc), ("http", self.http)) if part is None]


def tls_summary(tls: TlsSettings) -> str:
    """``grpc=mutual,http=on,passthrough=off``: the start-up line's account of TLS."""
    def mode(part: ServerTls | ClientTls | None) -> str:
        return "off" if part is None else "mutual" if part.mutual else "on"
    return ",".join(f"{name}={mode(part)}" for name, part in
                    (("grpc", tls.grpc), ("http", tls.http), ("passthrough", tls.passthrough),
                     ("stage", tls.stage)))


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def warn_plaintext(bind: str, tls: TlsSettings) -> None:
    """Off loopback, one warning line naming the client ports that serve without TLS."""
    plain = tls.plaintext_ports()
    if plain and not is_loopback(bind):
        log.warning("event=plaintext_off_loopback bind=%s ports=%s hint=anyone who reaches %s reads and sends "
                    "requests in clear; serve them with --grpc-use-ssl / --http-use-ssl", bind, ",".join(plain), bind)


STAGE_TLS: list[ClientTls | None] = [None]  # serve --stage-use-ssl: the process's, set once at start (configure)


def configure_stage_tls(tls: ClientTls | None) -> None:
    STAGE_TLS[0] = tls


def stage_channel(url: str, options: list) -> grpc.aio.Channel:
    """A channel to a planned model's tritonserver: TLS where serve --stage-use-ssl says so, else plaintext."""
    tls = STAGE_TLS[0]
    if tls is None:
        return grpc.aio.insecure_channel(url, options=options)
    return grpc.aio.secure_channel(url, tls.grpc_credentials(), options=options)
