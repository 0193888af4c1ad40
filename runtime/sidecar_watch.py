"""How ``launch --sidecar`` asks the sidecar which deployment it serves (``GET /v2/poolpipe/plan``): over plain
HTTP, or over HTTPS where the sidecar serves it (``serve --http-use-ssl``), trusting ``--sidecar-root-cert`` and
presenting ``--sidecar-client-cert`` where the sidecar asks for a client certificate (``--http-use-ssl-mutual``);
with the header ``--sidecar-restricted-key KEY=VALUE`` where ``serve --http-restricted-api`` restricts the
``poolpipe-admin`` endpoints (or ``model-repository``, which they follow) to callers sending it."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from poolpipe_common.errors import InputError

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a header name as serve's restricted-API flags take it


class SidecarRefused(Exception):
    """The sidecar answered launch's call with a refusal (HTTP 403: a restricted API without the right key)."""


def restricted_key(spec: str) -> tuple[str, str]:
    """``--sidecar-restricted-key KEY=VALUE`` (the ``<key>=<value>`` of serve's ``--http-restricted-api``): the
    header launch sends on each call to the sidecar's admin endpoints. A wrong SPEC is a one-line InputError."""
    key, eq, value = spec.partition("=")
    if not eq or not _KEY.match(key) or not value or not value.isprintable() or not value.isascii():
        raise InputError(f"--sidecar-restricted-key {spec!r}: expected KEY=VALUE as in serve's "
                         "--http-restricted-api <api>:<key>=<value>, e.g. --sidecar-restricted-key admin-key=SECRET")
    return key, value


def client_context(root: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """The HTTPS client side: ``root`` signs the sidecar's certificate (None: the system's roots), ``cert`` and
    ``key`` are launch's own where the sidecar asks for one. A file TLS cannot use is a one-line error."""
    if (cert is None) != (key is None):
        raise InputError("--sidecar-client-cert and --sidecar-client-key go together")
    try:
        ctx = ssl.create_default_context(cafile=str(root) if root is not None else None)
    except (ssl.SSLError, OSError) as e:
        raise InputError(f"--sidecar-root-cert {root}: TLS cannot use it ({e})") from None
    if cert is not None:
        try:
            ctx.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as e:
            raise InputError(f"--sidecar-client-cert {cert} / --sidecar-client-key {key}: TLS cannot use them "
                             f"({e})") from None
    return ctx


@dataclass(frozen=True)
class SidecarWatch:
    """The sidecar at ``address`` (HOST:PORT of its HTTP port), asked over HTTPS when ``tls`` is given."""

    address: str
    tls: ssl.SSLContext | None = None
    key: tuple[str, str] | None = None  # --sidecar-restricted-key: (header, value) sent on every call

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.address}/v2/poolpipe/plan"

    def serves(self, directory: Path) -> bool:
        """Whether the sidecar dispatches to ``directory`` and no reload is under way (False: not, or unreachable);
        SidecarRefused when it refuses the call (a restricted API: no key, or another one), which asking again
        cannot change."""
        request = urllib.request.Request(self.url, headers=dict([self.key]) if self.key is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=2, context=self.tls) as r:
                state = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 403:
                raise SidecarRefused(f"the sidecar refuses GET {self.url}: HTTP 403 {_error_of(e)} (give launch "
                                     "--sidecar-restricted-key KEY=VALUE, the key of serve --http-restricted-api)"
                                     ) from None
            return False
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return Path(state.get("directory", "")) == directory and not state.get("reloading")


def _error_of(e: urllib.error.HTTPError) -> str:
    """The sidecar's error message (its body is {"error": "..."})."""
    try:
        return str(json.loads(e.read()).get("error", ""))
    except (ValueError, AttributeError, OSError):
        return ""


def sidecar_watch(address: str | None, use_ssl: bool, root: Path | None, cert: Path | None,
                  key: Path | None, restricted: str | None = None) -> SidecarWatch | None:
    """launch's flags: None without ``--sidecar``; HTTPS with ``--sidecar-use-ssl`` or any certificate flag;
    ``restricted``: ``--sidecar-restricted-key KEY=VALUE``."""
    if address is None:
        if use_ssl or root or cert or key or restricted:
            raise InputError("--sidecar-use-ssl, --sidecar-restricted-key and the --sidecar-*-cert flags need "
                             "--sidecar HOST:PORT")
        return None
    tls = client_context(root, cert, key) if use_ssl or root or cert or key else None
    return SidecarWatch(address, tls, restricted_key(restricted) if restricted is not None else None)
