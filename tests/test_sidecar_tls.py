"""TLS and mutual TLS on ``poolpipe serve`` (tritonserver's flag names): tritonclient over gRPC with ssl=True and
over HTTPS infers a planned and a pass-through model, a plaintext client and a client without the right certificate
are refused, the sidecar reaches a pass-through Triton that serves TLS itself, the native front end's tritonserver
takes the same flags, and certificates that do not load, have expired or are another key's are one-line errors."""

from __future__ import annotations

import logging
import re
import ssl
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from backends import native_front
from poolpipe.cli import build_parser
from poolpipe_common.net import free_ports
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.sidecar_watch import SidecarWatch, sidecar_watch
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from runtime.tritonserver import TritonProcess
from scheduler.server.common.tls import ServerTls, TlsSettings, warn_plaintext
from tests.conftest import run_cli, run_perf_analyzer
from tests.tls_certs import Certs, make_certs

MODELS = Path(__file__).resolve().parent / "models"
A = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _server_flags(port: str, c: Certs, mutual: bool) -> tuple[str, ...]:
    flags = (f"--{port}-use-ssl", f"--{port}-server-cert", str(c.server_cert), f"--{port}-server-key",
             str(c.server_key))
    return flags + ((f"--{port}-use-ssl-mutual", f"--{port}-root-cert", str(c.ca)) if mutual else ())


def _https_context(c: Certs, client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(c.ca))
    if client_cert:
        ctx.load_cert_chain(c.client_cert, c.client_key)
    return ctx


def _grpc(url: str, c: Certs, client: tuple[Path, Path] | None = None) -> grpcclient.InferenceServerClient:
    key, chain = (str(client[1]), str(client[0])) if client else (None, None)
    return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(c.ca), private_key=key,
                                            certificate_chain=chain)


def _https(url: str, c: Certs, client_cert: bool = False,
           client: tuple[Path, Path] | None = None) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(c.ca)}
    if client_cert:
        client = (c.client_cert, c.client_key)
    if client is not None:
        options |= {"certfile": str(client[0]), "keyfile": str(client[1])}
    return httpclient.InferenceServerClient(url, ssl=True, ssl_options=options)


def _simple(client, mod) -> None:
    """Triton's example ``simple`` model (the pass-through one) answers A+B."""
    inputs = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(A)
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * A)


def _planned(client, mod) -> np.ndarray:
    """One inference of the planned (emulated) model; its output."""
    meta = client.get_model_metadata(EMULATED_MODEL)
    first = meta.inputs[0] if mod is grpcclient else meta["inputs"][0]
    name, dims = (first.name, first.shape) if mod is grpcclient else (first["name"], first["shape"])
    shape = [2, *[int(d) for d in dims[1:]]]
    inp = mod.InferInput(name, shape, "FP32")
    inp.set_data_from_numpy(np.random.default_rng(0).random(shape, dtype=np.float32))
    out = client.infer(EMULATED_MODEL, [inp])
    answer = out.as_numpy((meta.outputs[0].name if mod is grpcclient else meta["outputs"][0]["name"]))
    assert answer is not None and answer.shape[0] == 2
    return answer


# --- one-line errors at start ----------------------------------------------------------------------------

def _serve_error(*flags: str) -> str:
    g, h, m = free_ports(3)
    out = run_cli("serve", "--passthrough", "127.0.0.1:9", "--grpc-port", str(g), "--http-port", str(h),
                  "--metrics-port", str(m), *flags, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.parametrize("case,expected", [
    ("expired", "expired on"),
    ("other key", "does not match --grpc-server-cert"),
    ("not pem", "not a PEM certificate"),
    ("missing", "cannot read it"),
    ("key not pem", "not a PEM private key"),
])
def test_bad_certificates_are_one_line_errors_at_start(certs: Certs, case: str, expected: str) -> None:
    cert, key = {"expired": (certs.expired_cert, certs.server_key),
                 "other key": (certs.server_cert, certs.client_key),
                 "not pem": (certs.not_pem, certs.server_key),
                 "missing": (certs.server_cert.with_name("nowhere.pem"), certs.server_key),
                 "key not pem": (certs.server_cert, certs.not_pem)}[case]
    line = _serve_error("--grpc-use-ssl", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key))
    assert line.startswith("poolpipe serve: error: --grpc-server-") and expected in line


@pytest.mark.parametrize("flags,expected", [
    (("--http-use-ssl-mutual", "--http-server-cert", "{cert}", "--http-server-key", "{key}"),
     "--http-use-ssl-mutual needs --http-root-cert"),
    (("--grpc-use-ssl",), "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (("--grpc-server-cert", "{cert}"), "--grpc-server-cert is given but --grpc-use-ssl is not"),
    (("--http-use-ssl", "--http-server-cert", "{cert}", "--http-server-key", "{key}", "--native-grpc-port", "1"),
     "the native front end's HTTP port (tritonserver's own HTTP endpoint) cannot take TLS"),
    (("--passthrough-root-cert", "{ca}"), "--passthrough-root-cert is given but --passthrough-use-ssl is not"),
    (("--passthrough-use-ssl", "--passthrough-root-cert", "{cert}", "--passthrough-client-key", "{key}"),
     "--passthrough-client-cert and --passthrough-client-key go together"),
    (("--stage-use-ssl", "--stage-root-cert", "{ca}"), "--stage-use-ssl needs --stage-protocol grpc"),
])
def test_incomplete_tls_flags_are_refused(certs: Certs, flags: tuple[str, ...], expected: str) -> None:
    names = {"cert": certs.server_cert, "key": certs.server_key, "ca": certs.ca}
    assert expected in _serve_error(*(f.format(**names) for f in flags))


def test_off_loopback_without_tls_one_warning_line(certs: Certs, caplog: pytest.LogCaptureFixture) -> None:
    tls = TlsSettings(grpc=ServerTls(certs.server_cert, certs.server_key))
    with caplog.at_level(logging.WARNING, "poolpipe.sidecar"):
        warn_plaintext("127.0.0.1", TlsSettings())  # loopback: nothing said
        warn_plaintext("0.0.0.0", tls)
    assert len(caplog.records) == 1
    assert "plaintext_off_loopback bind=0.0.0.0 ports=http " in caplog.records[0].getMessage()
    caplog.clear()
    warn_plaintext("10.1.2.3", TlsSettings(grpc=tls.grpc, http=tls.grpc))
    assert not caplog.records


# --- live: a planned model and a pass-through one over TLS ------------------------------------------------

@pytest.fixture(scope="module")
def secured(certs: Certs, tmp_path_factory: pytest.TempPathFactory):
    """An emulated planned deployment and Triton's ``simple`` model behind a sidecar with mutual TLS on gRPC and
    TLS on HTTP."""
    work = tmp_path_factory.mktemp("tls")
    deploy = build_emulated_deployment(work, slo_us=3_000_000.0)
    flags = _server_flags("grpc", certs, mutual=True) + _server_flags("http", certs, mutual=False)
    with TritonProcess(MODELS, log_path=work / "triton.log") as triton, \
            Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
        sc = SidecarProcess(manifest=deploy, passthrough=triton.grpc_url, log_path=work / "sidecar.log",
                            extra_args=flags, http_ssl=_https_context(certs, client_cert=False))
        try:
            yield sc.start().wait_ready()
        finally:
            assert sc.stop() == 0


@pytest.mark.triton
def test_mutual_tls_grpc_infers_planned_and_passthrough(secured: SidecarProcess, certs: Certs) -> None:
    c = _grpc(secured.grpc_url, certs, (certs.client_cert, certs.client_key))
    assert c.is_server_ready()
    _planned(c, grpcclient)
    _simple(c, grpcclient)


@pytest.mark.triton
@pytest.mark.parametrize("who", ["plaintext", "no client certificate", "a stranger's certificate"])
def test_grpc_refuses_clients_without_the_right_certificate(secured: SidecarProcess, certs: Certs, who: str) -> None:
    client = {"plaintext": lambda: grpcclient.InferenceServerClient(secured.grpc_url),
              "no client certificate": lambda: _grpc(secured.grpc_url, certs),
              "a stranger's certificate": lambda: _grpc(secured.grpc_url, certs,
                                                        (certs.other_client_cert, certs.other_client_key))}[who]()
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        client.is_server_live()


@pytest.mark.triton
def test_https_infers_planned_and_passthrough(secured: SidecarProcess, certs: Certs) -> None:
    c = _https(secured.http_url, certs)
    assert c.is_server_ready()
    planned = _planned(c, httpclient)
    np.testing.assert_array_equal(planned, _planned(_grpc(secured.grpc_url, certs,
                                                          (certs.client_cert, certs.client_key)), grpcclient))
    _simple(c, httpclient)
    with pytest.raises(Exception):  # noqa: B017 - a plaintext request on the TLS port: the connection fails
        httpclient.InferenceServerClient(secured.http_url, connection_timeout=5, network_timeout=5).is_server_live()


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_with_its_ssl_flags(secured: SidecarProcess, certs: Certs, protocol: str) -> None:
    flags = {"grpc": ("--ssl-grpc-use-ssl", "true", "--ssl-grpc-root-certifications-file", str(certs.ca),
                      "--ssl-grpc-private-key-file", str(certs.client_key), "--ssl-grpc-certificate-chain-file",
                      str(certs.client_cert)),
             "http": ("--ssl-https-ca-certificates-file", str(certs.ca))}[protocol]
    url = secured.grpc_url if protocol == "grpc" else f"https://{secured.http_url}"
    out = run_perf_analyzer(url, "simple", protocol, *flags, "--measurement-mode", "count_windows",
                            "--measurement-request-count", "50", "--stability-percentage", "100")
    assert "Throughput:" in out


def _launch_watch(*flags: str) -> SidecarWatch | None:
    """What ``poolpipe launch DIR FLAGS`` watches the sidecar with."""
    a = build_parser().parse_args(["launch", "deploy", *flags])
    return sidecar_watch(a.sidecar, a.sidecar_use_ssl, a.sidecar_root_cert, a.sidecar_client_cert,
                         a.sidecar_client_key)


@pytest.mark.triton
def test_launch_watches_an_https_sidecar_with_its_root_certificate(secured: SidecarProcess, certs: Certs) -> None:
    """launch --sidecar with --sidecar-root-cert asks the sidecar over HTTPS which deployment it serves, so a
    migration's old servers stop once it serves the new one (before, launch asked over plain HTTP, an HTTPS sidecar
    never answered, and the old servers ran on)."""
    directory = Path(secured.manifest).resolve()
    watch = _launch_watch("--sidecar", secured.http_url, "--sidecar-root-cert", str(certs.ca))
    assert watch is not None and watch.url.startswith("https://") and watch.serves(directory)
    assert not watch.serves(directory / "other")
    assert not _launch_watch("--sidecar", secured.http_url).serves(directory)  # plain HTTP to the HTTPS port
    stranger = _launch_watch("--sidecar", secured.http_url, "--sidecar-root-cert", str(certs.other_ca))
    assert not stranger.serves(directory)  # roots that did not sign the sidecar's certificate: refused


@pytest.mark.parametrize(("flags", "expected"), [
    (("--sidecar-root-cert", "ca.pem"), "need --sidecar HOST:PORT"),
    (("--sidecar", "127.0.0.1:1", "--sidecar-root-cert", "NOT_PEM"), "--sidecar-root-cert .*TLS cannot use it"),
    (("--sidecar", "127.0.0.1:1", "--sidecar-client-cert", "CLIENT"), "go together")])
def test_launch_refuses_sidecar_tls_flags_it_cannot_use(certs: Certs, tmp_path: Path, flags: tuple[str, ...],
                                                       expected: str) -> None:
    flags = tuple(str(certs.not_pem) if f == "NOT_PEM" else str(certs.client_cert) if f == "CLIENT" else f
                  for f in flags)
    r = run_cli("launch", str(tmp_path), *flags)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.search(expected, r.stderr), r.stderr


# --- live: TLS to the pass-through Triton; mutual TLS on HTTPS --------------------------------------------

@pytest.mark.triton
def test_passthrough_triton_over_tls_and_mutual_https(certs: Certs, tmp_path: Path) -> None:
    """The pass-through Triton serves gRPC over TLS only (tritonserver's own flags, mutual): the sidecar reaches it
    with --passthrough-use-ssl and its client certificate; clients reach the sidecar over gRPC TLS and mutual
    HTTPS."""
    triton_flags = ServerTls(certs.server_cert, certs.server_key, certs.ca, mutual=True).triton_args()
    flags = _server_flags("grpc", certs, mutual=False) + _server_flags("http", certs, mutual=True) + (
        "--passthrough-use-ssl", "--passthrough-root-cert", str(certs.ca), "--passthrough-client-cert",
        str(certs.client_cert), "--passthrough-client-key", str(certs.client_key))
    with TritonProcess(MODELS, log_path=tmp_path / "triton.log", extra_args=triton_flags) as triton:
        with pytest.raises(InferenceServerException):  # the Triton itself refuses plaintext
            grpcclient.InferenceServerClient(triton.grpc_url).is_server_live()
        with SidecarProcess(passthrough=triton.grpc_url, log_path=tmp_path / "sidecar.log", extra_args=flags,
                            http_ssl=_https_context(certs, client_cert=True)) as sc:
            _simple(_grpc(sc.grpc_url, certs), grpcclient)
            _simple(_https(sc.http_url, certs, client_cert=True), httpclient)
            with pytest.raises(Exception):  # noqa: B017 - no client certificate: the handshake fails
                _https(sc.http_url, certs).is_server_live()
            with pytest.raises(Exception):  # noqa: B017 - a certificate another CA signed: refused too
                _https(sc.http_url, certs, client=(certs.other_client_cert, certs.other_client_key)).is_server_live()
            assert "tls=grpc=on,http=mutual,passthrough=mutual,stage=off" in (tmp_path / "sidecar.log").read_text()


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_native_front_end_takes_the_grpc_tls_flags(certs: Certs, tmp_path: Path) -> None:
    """--native-grpc-port with --grpc-use-ssl-mutual: Triton's own front end serves the planned model over mutual
    TLS (the same flags, handed to its tritonserver) and refuses a plaintext client."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    port, = free_ports(1)
    sc = SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                        extra_args=("--native-grpc-port", str(port), *_server_flags("grpc", certs, mutual=True)))
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        try:
            sc.start().wait_ready()
            native = f"127.0.0.1:{port}"
            want = _planned(_grpc(sc.grpc_url, certs, (certs.client_cert, certs.client_key)), grpcclient)
            np.testing.assert_array_equal(
                _planned(_grpc(native, certs, (certs.client_cert, certs.client_key)), grpcclient), want)
            with pytest.raises(InferenceServerException):
                grpcclient.InferenceServerClient(native).is_server_live()
            with pytest.raises(InferenceServerException):
                _grpc(native, certs).is_server_live()
        finally:
            assert sc.stop() == 0


@pytest.mark.triton
def test_stage_calls_over_mutual_tls(certs: Certs, tmp_path: Path) -> None:
    """The stage servers serve gRPC over mutual TLS only (launch's --triton-arg, tritonserver's flags): a sidecar
    with --stage-use-ssl and its client certificate serves the planned model through them; one without cannot
    reach them and says which stage is missing."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    server_tls = ServerTls(certs.server_cert, certs.server_key, certs.ca, mutual=True).triton_args()
    stage = ("--stage-protocol", "grpc", "--stage-use-ssl", "--stage-root-cert", str(certs.ca),
             "--stage-client-cert", str(certs.client_cert), "--stage-client-key", str(certs.client_key))
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs", triton_args=server_tls):
        with SidecarProcess(manifest=deploy, log_path=tmp_path / "tls.log", extra_args=stage) as sc:
            sc.wait_ready()
            c = grpcclient.InferenceServerClient(sc.grpc_url)
            _planned(c, grpcclient)
            assert "stage=mutual" in (tmp_path / "tls.log").read_text()
        with SidecarProcess(manifest=deploy, log_path=tmp_path / "plain.log",
                            extra_args=("--stage-protocol", "grpc")) as plain:
            t0 = time.monotonic()
            while "event=not_ready" not in (tmp_path / "plain.log").read_text():
                assert time.monotonic() - t0 < 60, "the sidecar did not say what is missing"
                time.sleep(0.2)
            assert not grpcclient.InferenceServerClient(plain.grpc_url).is_server_ready()
            assert "no vGPU up" in (tmp_path / "plain.log").read_text()


@pytest.mark.triton
def test_workers_serve_tls_on_their_shared_ports(certs: Certs, tmp_path: Path) -> None:
    """serve --workers 2 with mutual TLS on gRPC and TLS on HTTP: each worker takes the flags (SO_REUSEPORT and
    TLS together), so every connection, whichever worker the kernel hands it to, is TLS."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0, gpus=2, addresses=("127.0.0.1", "127.0.0.1"))
    flags = ("--workers", "2", *_server_flags("grpc", certs, mutual=True), *_server_flags("http", certs, False))
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        sc = SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log", extra_args=flags,
                            http_ssl=_https_context(certs, client_cert=False))
        try:
            sc.start().wait_ready()
            for _ in range(4):  # new connections: the kernel spreads them over both workers
                _planned(_grpc(sc.grpc_url, certs, (certs.client_cert, certs.client_key)), grpcclient)
                _planned(_https(sc.http_url, certs), httpclient)
                with pytest.raises(InferenceServerException):
                    grpcclient.InferenceServerClient(sc.grpc_url).is_server_live()
            assert (tmp_path / "sidecar.log").read_text().count("tls=grpc=mutual,http=on") == 2  # each worker's
        finally:
            assert sc.stop() == 0
