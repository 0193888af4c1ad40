"""Adding and removing servers of a running deployment: the migration from one generated deployment to the next.

``poolpipe generate --previous OLD --out NEW`` keeps the ports of the vGPUs both plans have on the same device
(model_repository_gen.generations). Migrating a running :class:`~runtime.launch.Deployment` to NEW
(:func:`begin_migration`) then happens in two steps around the sidecar's reload:

1. :meth:`Migration.begin` starts the servers only NEW has and loads NEW's partition models into the kept servers
   (Triton's model-control API; their old models keep serving the old plan);
2. the sidecar switches to NEW (SIGHUP or ``POST /v2/poolpipe/reload``; it waits for the old plan's batches);
3. :meth:`Migration.finish` unloads the old models from the kept servers and stops the servers only OLD had.

:meth:`Migration.abort` undoes step 1. Servers the deployment did not start (``owned`` is false: e.g. launched by
another process) are never stopped: their models are unloaded and the report names them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from model_repository_gen.generations import device_env
from poolpipe_common.errors import InputError
from runtime.launch import Deployment
from runtime.launch_files import ServerLaunch
from runtime.model_control import load_model_dir, same_model, unload_model
from runtime.tritonserver import TritonProcess


@dataclass(frozen=True)
class Endpoint:
    address: str
    http_port: int
    grpc_port: int
    metrics_port: int


def endpoint(s: ServerLaunch) -> Endpoint:
    return Endpoint(s.address, s.http_port, s.grpc_port, s.metrics_port)


@dataclass(frozen=True)
class MigrationSteps:
    """What moves: servers kept (old, new), added (new only), removed (old only), models to load / unload."""

    keep: tuple[tuple[ServerLaunch, ServerLaunch], ...]
    add: tuple[ServerLaunch, ...]
    remove: tuple[ServerLaunch, ...]
    load: tuple[tuple[ServerLaunch, str], ...]  # (new server, model) to load into a kept server
    unload: tuple[tuple[ServerLaunch, str], ...]  # (old server, model) to unload after the switch

    def summary(self) -> str:
        return (f"{len(self.keep)} server(s) kept ({len(self.load)} model(s) to load, {len(self.unload)} to unload), "
                f"{len(self.add)} to start, {len(self.remove)} to stop")


def migration_steps(old: Sequence[ServerLaunch], new: Sequence[ServerLaunch], compare_models: bool = True
                    ) -> MigrationSteps:
    """Match servers by endpoint and device; refuse what cannot run side by side (one-line InputErrors).

    ``compare_models``: check that a model name a kept server has on both sides is the same model (its files)."""
    old_at = {endpoint(s): s for s in old}
    keep, add = [], []
    for s in new:
        o = old_at.get(endpoint(s))
        if o is not None and device_env(o.env) == device_env(s.env):
            keep.append((o, s))
        else:
            add.append(s)
    kept_old = {id(o) for o, _ in keep}
    remove = [o for o in old if id(o) not in kept_old]
    busy = {(o.address, p): o for o in remove for p in (o.http_port, o.grpc_port, o.metrics_port)}
    for s in add:
        for p in (s.http_port, s.grpc_port, s.metrics_port):
            if (s.address, p) in busy:
                raise InputError(f"vGPU {s.vgpu} of the new deployment needs port {p} on {s.address}, which vGPU "
                                 f"{busy[(s.address, p)].vgpu} of the running one uses on another device or share; "
                                 "generate the new deployment with --previous (the running one's directory) so that "
                                 "its ports move")
    load, unload = [], []
    for o, s in keep:
        for m in sorted(set(s.models) & set(o.models)):
            if compare_models and not same_model(o.model_dir(m), s.model_dir(m)):
                raise InputError(f"vGPU {s.vgpu}: model {m} differs between the running and the new deployment, "
                                 "and one server cannot hold both; generate the new one with --previous so that "
                                 "its partition models get new names")
        load += [(s, m) for m in s.models if m not in o.models]
        unload += [(o, m) for m in o.models if m not in s.models]
    return MigrationSteps(tuple(keep), tuple(add), tuple(remove), tuple(load), tuple(unload))


@dataclass
class MigrationReport:
    started: list[str] = field(default_factory=list)  # vGPU ids
    kept: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)  # "vgpu:model"
    unloaded: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    left_running: list[str] = field(default_factory=list)  # removed servers this deployment did not start

    def line(self) -> str:
        return (f"started {len(self.started)}, kept {len(self.kept)} (loaded {len(self.loaded)} model(s), unloaded "
                f"{len(self.unloaded)}), stopped {len(self.stopped)}"
                + (f", not started here so left running: {', '.join(self.left_running)}" if self.left_running else ""))


def run_all(jobs: Sequence[Callable[[], None]], workers: int = 4) -> None:
    """Run ``jobs`` on a few threads (model loads are I/O for this process); the first error is raised."""
    if not jobs:
        return
    with ThreadPoolExecutor(min(workers, len(jobs))) as pool:
        for f in [pool.submit(j) for j in jobs]:
            f.result()


class Migration:
    """One migration of a :class:`~runtime.launch.Deployment` to another generated directory (module doc)."""

    def __init__(self, deployment: Deployment, directory: str | Path) -> None:
        self.deployment = deployment
        self.directory, self.manifest, self.launches = deployment.read(directory)
        new = [s for h in self.launches for s in h.servers]
        self.steps = migration_steps(deployment.server_launches, new)
        self.report = MigrationReport(kept=[s.vgpu for _, s in self.steps.keep])
        self._started: dict[str, TritonProcess] = {}

    def begin(self) -> "Migration":
        """Start the added servers and load the new models into the kept ones; undone on failure."""
        try:
            self._started = self.deployment.spawn(self.steps.add)
            self.report.started = sorted(self._started)
            run_all([self._load(s, m) for s, m in self.steps.load])
        except BaseException:
            self.abort()
            raise
        return self

    def _load(self, s: ServerLaunch, m: str) -> Callable[[], None]:
        def run() -> None:
            load_model_dir(s.http_url, s.model_dir(m))
            self.report.loaded.append(f"{s.vgpu}:{m}")
        return run

    def _unload(self, s: ServerLaunch, m: str) -> Callable[[], None]:
        def run() -> None:
            unload_model(s.http_url, m)
            self.report.unloaded.append(f"{s.vgpu}:{m}")
        return run

    def abort(self) -> None:
        """Back to the running deployment alone: the loaded models unloaded, the started servers stopped."""
        loaded = [(s, m) for s, m in self.steps.load if f"{s.vgpu}:{m}" in self.report.loaded]
        try:
            run_all([self._unload(s, m) for s, m in loaded])
        finally:
            self.deployment.stop(list(self._started))

    def finish(self) -> MigrationReport:
        """After the sidecar's switch: unload the old models, stop the removed servers; the deployment is now
        the new directory's."""
        dep = self.deployment
        owned = [o for o in self.steps.remove if o.vgpu in dep.servers]
        others = [o for o in self.steps.remove if o.vgpu not in dep.servers]
        run_all([self._unload(o, m) for o, m in self.steps.unload]
                + [self._unload(o, m) for o in others for m in o.models])
        dep.stop([o.vgpu for o in owned])
        self.report.stopped = sorted(o.vgpu for o in owned)
        self.report.left_running = sorted(o.vgpu for o in others)
        for o, s in self.steps.keep:  # a kept vGPU may have a new id; its process stays
            if o.vgpu in dep.servers:
                dep.servers[s.vgpu] = dep.servers.pop(o.vgpu)
        dep.directory, dep.manifest, dep.launches = self.directory, self.manifest, self.launches
        return self.report


def begin_migration(deployment: Deployment, directory: str | Path) -> Migration:
    """Start migrating ``deployment`` to another generated directory: the servers only it has are started and its
    new partitions loaded into the kept servers; call ``finish()`` once the sidecar has switched."""
    return Migration(deployment, directory).begin()
