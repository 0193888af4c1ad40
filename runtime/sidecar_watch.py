"""How ``launch --sidecar`` asks the sidecar which deployment it serves (``GET /v2/poolpipe/plan``): over plain
HTTP, or over HTTPS where the sidecar serves it (``serve --http-use-ssl``), trusting ``--sidecar-root-cert`` and
presenting ``--sidecar-client-cert`` where the sidecar asks for a client certificate (``--http-use-ssl-mutual``)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from poolpipe_common.errors import InputError


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

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.address}/v2/poolpipe/plan"

    def serves(self, directory: Path) -> bool:
        """Whether the sidecar dispatches to ``directory`` and no reload is under way (False: not, or unreachable)."""
        try:
            with urllib.request.urlopen(self.url, timeout=2, context=self.tls) as r:
                state = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return Path(state.get("directory", "")) == directory and not state.get("reloading")


def sidecar_watch(address: str | None, use_ssl: bool, root: Path | None, cert: Path | None,
                  key: Path | None) -> SidecarWatch | None:
    """launch's flags: None without ``--sidecar``; HTTPS with ``--sidecar-use-ssl`` or any certificate flag."""
    if address is None:
        if use_ssl or root or cert or key:
            raise InputError("--sidecar-use-ssl and the --sidecar-*-cert flags need --sidecar HOST:PORT")
        return None
    tls = client_context(root, cert, key) if use_ssl or root or cert or key else None
    return SidecarWatch(address, tls)
