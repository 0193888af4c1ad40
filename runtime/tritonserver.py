"""Find and run a real ``tritonserver``: NVIDIA's container install, or the one in the nvidia-pytriton wheel.

The wheel ships the binary, its libraries and Python-backend stubs for several Python versions but
no ready backend directory, so :func:`backend_directory` assembles one (python backend + the stub
matching the running interpreter) under a cache directory. :class:`TritonProcess` starts one server,
waits until it is ready, and stops it (SIGTERM, then SIGKILL), removing the Python backend's
shared-memory regions it owned; before it starts, it removes the regions that dead predecessors left on its gRPC
port (a SIGKILLed server's, whose owner died too), in one log line.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from poolpipe_common.errors import InputError
from poolpipe_common.net import fill_free_ports, port_in_use

CONTAINER_ROOT = Path("/opt/tritonserver")
CACHE_DIR = Path(os.environ.get("POOLPIPE_CACHE", Path(tempfile.gettempdir()) / "poolpipe-triton"))
SHM_PREFIX = "poolpipe_pb_"  # Python-backend shm regions get this prefix, so leftovers can be found
_log = logging.getLogger("poolpipe.runtime")


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path
    lib_dirs: tuple[Path, ...]
    # The Python interpreter its Python backend's stub runs: this one for the wheel (a stub matched to it),
    # NGC's python3 in the container, $POOLPIPE_BACKEND_PYTHON beside $POOLPIPE_TRITONSERVER (None: unknown)
    python: str | None = None


def _pytriton_root() -> Path | None:
    try:
        import pytriton  # noqa: PLC0415
    except ImportError:
        return None
    return Path(pytriton.__file__).parent


def backend_directory(pytriton_root: Path) -> Path:
    """A backend dir with the python backend and the stub for this interpreter (built once, cached)."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pytriton_root / "tritonserver" / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise InputError(f"nvidia-pytriton has no Python backend stub for Python {ver}; use Python 3.8-3.13")
    dest = CACHE_DIR / f"backends-py{ver}"
    marker = dest / "python" / "triton_python_backend_stub"
    if not marker.is_file() or marker.stat().st_size != stub.stat().st_size:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=CACHE_DIR))  # built aside, then renamed: concurrent starts never see half
        shutil.copytree(pytriton_root / "tritonserver" / "backends", tmp / "b")
        shutil.copy2(stub, tmp / "b" / "python" / "triton_python_backend_stub")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp / "b", dest)
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def find_triton() -> TritonInstall:
    """The tritonserver to use: $POOLPIPE_TRITONSERVER, NVIDIA's container, or the nvidia-pytriton wheel."""
    env_bin = os.environ.get("POOLPIPE_TRITONSERVER")
    if env_bin:
        b = Path(env_bin)
        return TritonInstall(b, b.parent.parent / "backends", (), os.environ.get("POOLPIPE_BACKEND_PYTHON"))
    if (CONTAINER_ROOT / "bin" / "tritonserver").is_file():
        python = shutil.which("python3")
        return TritonInstall(CONTAINER_ROOT / "bin" / "tritonserver", CONTAINER_ROOT / "backends", (), python)
    root = _pytriton_root()
    if root is None or not (root / "tritonserver" / "bin" / "tritonserver").is_file():
        raise InputError("no tritonserver found: install the nvidia-pytriton wheel (pip install nvidia-pytriton), "
                         "run inside NVIDIA's Triton container, or set POOLPIPE_TRITONSERVER")
    libs = (root.parent / "nvidia_pytriton.libs", root / "tritonserver" / "backends" / "python")
    return TritonInstall(root / "tritonserver" / "bin" / "tritonserver", backend_directory(root), libs, sys.executable)


def server_env(install: TritonInstall, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a tritonserver: its libraries, and for Python models this interpreter's packages, only where
    the backend's stub runs this interpreter: another Python (NGC's) would import wrong-ABI numpy/onnxruntime from
    them, so it keeps its own packages and the PYTHONPATH the user set."""
    env = dict(os.environ)
    if install.lib_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*(str(p) for p in install.lib_dirs),
                                                  env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    if install.python is not None and Path(install.python).resolve() == Path(sys.executable).resolve():
        # The backend stub ignores PYTHONPATH for its own sys.path; our model.py files read it explicitly.
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + [str(Path(__file__).resolve().parent.parent)]))
    env.update(extra or {})
    return env


@dataclass
class TritonProcess:
    """One tritonserver on loopback; use as a context manager or call start()/stop()."""

    model_repository: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    name: str = "triton"
    proc: subprocess.Popen | None = None
    # its gRPC and HTTP ports shared with other tritonservers started so (Triton's --reuse-grpc-port and
    # --reuse-http-port: the kernel spreads connections over them), as the workers of serve --workers share theirs
    shared_ports: bool = False
    # ports not to pick for the ones not given: another server's, chosen but maybe not bound yet (the sidecar's own
    # ports while its native front end starts first); a pick onto one would take it from its owner
    avoid: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        ports = {k: getattr(self, k) for k in ("http_port", "grpc_port", "metrics_port")}
        for k, port in fill_free_ports(ports, self.avoid, self.host).items():
            setattr(self, k, port)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    def command(self, install: TritonInstall) -> list[str]:
        return [str(install.binary), f"--model-repository={self.model_repository}",
                f"--backend-directory={install.backend_dir}", f"--http-address={self.host}",
                f"--grpc-address={self.host}", f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
                f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
                "--exit-timeout-secs=10", "--log-verbose=0", *self.control_args, *self.reuse_args, *self.extra_args]

    @property
    def reuse_args(self) -> tuple[str, ...]:
        return ("--reuse-grpc-port=true", "--reuse-http-port=true") if self.shared_ports else ()

    @property
    def control_args(self) -> tuple[str, ...]:
        """Every model of the repository loaded at start, and the model-control API open (runtime.migration
        loads the next generation's partitions into a running server); unless ``extra_args`` choose a mode."""
        if any(a.startswith("--model-control-mode") for a in self.extra_args):
            return ()
        return ("--model-control-mode=explicit", "--load-model=*")

    def spawn(self) -> "TritonProcess":
        """Start the process without waiting for readiness (start many, then :meth:`wait_ready` on each)."""
        for port, shared in ((self.http_port, self.shared_ports), (self.grpc_port, self.shared_ports),
                             (self.metrics_port, False)):
            if port_in_use(port, self.host, shared):
                raise InputError(f"{self.name}: port {port} on {self.host} is already in use; choose another port")
        if "POOLPIPE_MIG_GPU" in self.env and not self.env.get("CUDA_VISIBLE_DEVICES"):
            raise InputError(f"{self.name}: a MIG vGPU whose instance is not resolved; start it with poolpipe launch "
                             "(which finds its UUID through NVML)")
        reclaim_port_regions(self.grpc_port)
        install = find_triton()
        exit_on_sigterm()
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.command(install), env=server_env(install, self.env),
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        return self

    def start(self, timeout_s: float = 60.0) -> "TritonProcess":
        self.spawn()
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def exited(self) -> int | None:
        """The exit status if the server has exited (None while it runs)."""
        return None if self.proc is None else self.proc.poll()

    @property
    def shm_prefix(self) -> str:
        """Prefix of the Python backend's shared-memory regions of this server (under /dev/shm)."""
        return f"{SHM_PREFIX}{os.getpid()}_{self.grpc_port}_"

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, http.client.HTTPException):  # e.g. another program on the port
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: tritonserver exited with status {self.proc.returncode} "
                                   f"before it was ready{self._log_hint()}")
            if self.is_ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: tritonserver not ready after {timeout_s:.0f} s{self._log_hint()}")

    def _log_hint(self) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        errors = [ln for ln in Path(self.log_path).read_text(errors="replace").splitlines() if ln.startswith("E")]
        return f" (log {self.log_path}: {errors[-1][:400] if errors else 'no error lines'})"

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the server's process group (server + backend stubs), SIGKILL after ``timeout_s``; clean shm."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own process group
        try:
            if self.proc.poll() is None:
                os.killpg(pgid, signal.SIGTERM)
                self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        finally:
            try:  # backend stubs that outlived their server
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            remove_shm_regions(self.shm_prefix)
            self.proc = None

    def __enter__(self) -> "TritonProcess":
        return self if self.proc is not None else self.start()  # already started: just manage its stop

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit in a program that starts servers, so that its ``with`` blocks and ``finally``
    clauses stop them: a server leads a session of its own and outlives a parent that the default SIGTERM kills
    outright (a benchmark stopped with ``kill`` left ten tritonservers and its sidecar running). Only from the main
    thread, and only where the program has not chosen a handler of its own (``poolpipe launch``, the sidecar)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def exited(pid: int) -> bool:
    """Gone, or a zombie with every thread exited: its files, listening sockets included, are closed. (Its cmdline
    reads empty earlier, while it is still exiting with its sockets open, so the name is no test of this; nor is the
    leader's own state: the main thread of a multi-threaded server such as tritonserver can be a zombie while its
    other threads still exit, holding the process's files.) A SIGKILLed process its parent has not reaped yet is
    exited, although ``kill(pid, 0)`` still finds it."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all(_task_state(pid, t) in ("Z", "X", None) for t in tasks)


def _task_state(pid: int, tid: str) -> str | None:
    """One thread's state letter (None: gone meanwhile)."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def region_owner(name: str) -> tuple[int, int] | None:
    """(owner pid, gRPC port) of a region named ``poolpipe_pb_<pid>_<port>_...`` (TritonProcess.shm_prefix)."""
    fields = name[len(SHM_PREFIX):].split("_", 2) if name.startswith(SHM_PREFIX) else []
    if len(fields) < 3 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def reclaim_port_regions(grpc_port: int, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Remove the Python-backend regions that servers of dead owners left on ``grpc_port`` (a server about to take
    the port is their successor: none of them can still be in use); one log line when there were any."""
    def dead_here(name: str) -> bool:
        owner = region_owner(name)
        return owner is not None and owner[1] == grpc_port and owner[0] != os.getpid() and exited(owner[0])

    removed = remove_shm_regions(SHM_PREFIX, shm_dir, only=dead_here)
    if removed:
        owners = sorted({n[len(SHM_PREFIX):].split("_", 1)[0] for n in removed})
        _log.info("event=reclaimed shm_regions=%d port=%d predecessors=%s", len(removed), grpc_port,
                  ",".join(owners))
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_shm_regions(prefix: str, shm_dir: Path = Path("/dev/shm"),
                       only: Callable[[str], bool] | None = None) -> list[str]:
    """Unlink POSIX shared-memory regions whose names start with ``prefix`` (and pass ``only``, when
    given); returns their names."""
    removed = []
    for p in shm_dir.glob(prefix + "*"):
        if only is not None and not only(p.name):
            continue
        try:
            p.unlink()
            removed.append(p.name)
        except FileNotFoundError:
            pass
    return removed
