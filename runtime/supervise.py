"""What ``poolpipe launch`` does beyond starting servers: it restarts a tritonserver that dies (with back-off, up to a
limit), and it names what it runs so that a successor reclaims what a dead ``launch`` left.

Each running ``launch`` keeps a state file, ``<cache>/launch/<pid>.json``: its directory and the pid of every
server it started (a sidecar that re-plans, and so starts servers, keeps one too, of kind ``sidecar``, which only
a sidecar reclaims). The Python backend's shared-memory regions of its servers are named ``poolpipe_pb_<pid>_...``
(runtime.tritonserver). A ``launch`` that starts finds the state files of dead ``launch`` processes (gone, or
zombies nobody reaped yet), stops the servers they left running (they run in their own sessions, so they outlive a
SIGKILLed ``launch``), removes the shared-memory regions of every dead ``launch``, and reports it in one line; each
server it starts removes what dead predecessors left on its own port (TritonProcess.spawn).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from poolpipe_common.errors import InputError
from runtime.launch import Deployment
from runtime.tritonserver import CACHE_DIR, SHM_PREFIX, TritonProcess, exited, pid_alive, remove_shm_regions

__all__ = ["Reclaimed", "RestartPolicy", "STATE_DIR", "Supervisor", "exited", "pid_alive", "reclaim_predecessors",
           "remove_state", "write_state"]

STATE_DIR = CACHE_DIR / "launch"


def _is_tritonserver(pid: int) -> bool:
    try:
        return b"tritonserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _stop_group(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM a server's process group (it leads its own session), SIGKILL what is left after ``timeout_s``; returns
    once the server has exited, so that its ports are free."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not exited(pid):
            time.sleep(0.05)
        if exited(pid):
            return


@dataclass(frozen=True)
class Reclaimed:
    """What dead predecessors left and this ``launch`` removed."""

    launches: tuple[int, ...] = ()
    servers: tuple[int, ...] = ()
    shm_regions: tuple[str, ...] = ()

    def line(self) -> str:
        who = ", ".join(map(str, self.launches)) or "none"
        return (f"reclaimed from dead launch processes ({who}): {len(self.servers)} tritonserver(s) stopped, "
                f"{len(self.shm_regions)} shm region(s) removed")


def _dead_owner(name: str) -> bool:
    """A region whose owner has exited: gone, or a zombie its parent has not reaped (a SIGKILLed ``launch``)."""
    head = name[len(SHM_PREFIX):].split("_", 1)[0]
    return head.isdigit() and int(head) != os.getpid() and exited(int(head))


def reclaim_predecessors(kind: str = "launch", state_dir: Path = STATE_DIR) -> Reclaimed:
    """Stop the servers of dead processes of ``kind`` and remove their state files and every dead process's
    Python-backend shm regions."""
    launches, servers = [], []
    for f in sorted(state_dir.glob("*.json")):
        try:
            state = json.loads(f.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid == os.getpid() or not exited(pid) or state.get("kind", "launch") != kind:
            continue
        launches.append(pid)
        for spid in state.get("servers", {}).values():
            if pid_alive(int(spid)) and _is_tritonserver(int(spid)):
                _stop_group(int(spid))
                servers.append(int(spid))
        f.unlink(missing_ok=True)
    regions = remove_shm_regions(SHM_PREFIX, only=_dead_owner)
    return Reclaimed(tuple(launches), tuple(servers), tuple(regions))


def write_state(dep: Deployment, kind: str = "launch", state_dir: Path = STATE_DIR) -> None:
    """Record this process's kind, directory and server pids (replaced atomically)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    servers = {v: s.proc.pid for v, s in dep.servers.items() if s.proc is not None}
    tmp = state_dir / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), "kind": kind, "directory": str(dep.directory),
                               "servers": servers}))
    os.replace(tmp, state_dir / f"{os.getpid()}.json")


def remove_state(state_dir: Path = STATE_DIR) -> None:
    (state_dir / f"{os.getpid()}.json").unlink(missing_ok=True)


@dataclass
class RestartPolicy:
    """A dead server is restarted after ``backoff_s`` x 2^(restarts so far), at most ``max_backoff_s``; more than
    ``max_restarts`` restarts of one server (counted since it last served ``healthy_s``) is an error."""

    max_restarts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    healthy_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError("restart policy: max_restarts and backoff_s must be >= 0, max_backoff_s >= backoff_s")

    def delay_s(self, restarts: int) -> float:
        """The back-off before the next restart of a process restarted ``restarts`` times so far."""
        return min(self.backoff_s * 2 ** restarts, self.max_backoff_s)

    def counted(self, restarts: int, since: float, now: float) -> int:
        """The restarts that still count: none once the process has served ``healthy_s`` since its last start."""
        return 0 if now - since > self.healthy_s else restarts


@dataclass
class Supervisor:
    """Restarts the deployment's servers that exit; ``say`` gets one line per restart."""

    dep: Deployment
    policy: RestartPolicy
    say: Callable[[str], None]
    restarts: dict[str, int] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)  # vGPU -> when its restart is due
    since: dict[str, float] = field(default_factory=dict)  # vGPU -> when it was last restarted

    def poll(self) -> str | None:
        """Schedule and run due restarts; returns an error when a server died more often than allowed."""
        now = time.monotonic()
        for vid, rc in self.dep.failed().items():
            if vid in self.due:
                continue
            n = self.restarts[vid] = self.policy.counted(self.restarts.get(vid, 0), self.since.get(vid, -1e18), now)
            if n >= self.policy.max_restarts:
                return (f"tritonserver of vGPU {vid} exited with status {rc} after {n} restart(s) "
                        f"(log: {self.dep.servers[vid].log_path})")
            delay = self.policy.delay_s(n)
            self.due[vid] = now + delay
            self.say(f"tritonserver of vGPU {vid} exited with status {rc}; restarting it in {delay:.1f} s "
                     f"(restart {n + 1} of at most {self.policy.max_restarts})")
        for vid in [v for v, t in self.due.items() if t <= now]:
            n = self.restarts[vid] = self.restarts.get(vid, 0) + 1
            self.since[vid] = now
            try:
                srv = self.respawn(vid)
            except (InputError, OSError) as e:  # e.g. its port still held: try again later, counted
                if n >= self.policy.max_restarts:
                    return f"tritonserver of vGPU {vid} could not be restarted: {e}"
                self.due[vid] = now + self.policy.delay_s(n)
                self.say(f"restart of vGPU {vid} failed ({e}); trying again")
                continue
            del self.due[vid]
            self.say(f"restarted tritonserver of vGPU {vid} (pid {srv.proc.pid if srv.proc else '?'})")
            write_state(self.dep)
        return None

    def respawn(self, vid: str) -> TritonProcess:
        """A new process for ``vid`` on the same ports and repository (the deployment's current launch of it);
        the dead one's process group and shm regions are cleaned up first, its log kept as ``.previous``."""
        old = self.dep.servers[vid]
        old.stop()
        launch = next((s for s in self.dep.server_launches if s.vgpu == vid), None)
        log = Path(old.log_path) if old.log_path else None
        if log is not None and log.exists():
            os.replace(log, log.with_name(log.name + ".previous"))
        srv = TritonProcess(launch.repository if launch else old.model_repository, old.http_port, old.grpc_port,
                            old.metrics_port, host=old.host, env=self.dep.env_of(launch) if launch else old.env,
                            log_path=log,
                            extra_args=old.extra_args, name=old.name)
        self.dep.servers[vid] = srv.spawn()
        return srv
