"""Reloading the plan while serving: the Router's current planned service, swapped from one manifest's plan to the
next.

A reload (SIGHUP, or ``POST /v2/poolpipe/reload``) loads the manifest and brings the new plan up beside
the old one (its own connections, shared-memory pool and calibration; the old plan keeps serving
meanwhile). When the new plan is ready, dispatching switches at a batch boundary: the old driver stops
(nothing new is dispatched), its queued rows move to the new driver with their deadlines, and new
requests go to the new plan. When the new plan uses a server the old one has batches on, the switch waits
for those batches first (the new driver's reservations cannot see them); otherwise the old batches finish
beside the new plan. Then the old plan's connections and shared-memory regions are dropped. Every request
is answered or gets an explicit error; a failed reload leaves the old plan serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from model_repository_gen.manifest import load_manifest
from poolpipe_common.errors import InputError
from scheduler.server.common.errors import ServeError
from scheduler.server.common.event_loop import freeze_heap
from scheduler.server.planned.calls import now_us
from scheduler.server.planned.service import PlannedService

log = logging.getLogger("poolpipe.sidecar.reload")

READY_TIMEOUT_S = 60.0  # the new plan must be calibrated and in service within this, else the reload fails
FLUSH_TIMEOUT_S = 30.0  # old batches still running after this are left to the old plan's close


class ReloadError(Exception):
    """The reload did not happen (the old plan keeps serving); the message says why, ``status`` as HTTP."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ReloadReport:
    manifest: str
    generation: int
    pause_ms: float  # no dispatch from the old driver's stop to the new driver's first step
    flush_ms: float  # until the old plan's last in-flight batch finished
    handed_over: int  # queued rows the new driver adopted
    failed: list[str] = field(default_factory=list)  # why rows could not be handed over (answered with errors)
    servers_added: list[str] = field(default_factory=list)
    servers_removed: list[str] = field(default_factory=list)
    shm_regions_removed: int = 0
    front_us: float = 0.0  # the deadlines' reserve the new plan serves with (serve --front-us, else its own)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def incompatible(old: PlannedService, new: PlannedService) -> list[str]:
    """Models in both plans whose tensors differ: their clients would break, so the reload is refused."""
    return [m for m, info in new.models.items() if m in old.models
            and (old.models[m].inputs, old.models[m].outputs) != (info.inputs, info.outputs)]


class PlanSwitch:
    """Which plan serves: the Router asks ``current`` (one PlannedService per plan); ``reload()`` swaps in the next.
    It only swaps plans: everything a request meets is the current plan's."""

    def __init__(self, current: PlannedService, manifest_path: Path,
                 open_plan: Callable[[Path, int], Awaitable[PlannedService]]) -> None:
        self.current = current
        # the Router tells it each planned request's model (serve --replan counts them across reloads)
        self.on_arrival: Callable[[str], None] | None = None
        self.manifest_path = manifest_path
        self.serving = manifest_directory(manifest_path)  # what the current plan was loaded from, resolved
        self.open_plan = open_plan
        self.generation = 0
        self.reloads = 0
        # run after each reload that switched plans (the native front end follows the new plan's models); a hook
        # that fails is logged: the new plan serves either way
        self.after_reload: list[Callable[[], Awaitable[None]]] = []
        self._lock = asyncio.Lock()

    @property
    def reloading(self) -> bool:
        return self._lock.locked()

    async def close(self) -> None:
        """Waits for a reload in progress (so that no plan it opened is left behind), then closes the plan."""
        async with self._lock:
            await self.current.close()

    # --- the swap ---------------------------------------------------------------------------------------
    async def reload(self, manifest_path: Path | None = None) -> ReloadReport:
        """Load ``manifest_path`` (default: the one the sidecar was started with) and switch to it."""
        if self._lock.locked():
            raise ReloadError("a reload is already in progress; wait for it to finish", 409)
        async with self._lock:
            path = manifest_path or self.manifest_path
            directory = manifest_directory(path)  # now: a symlink may be re-pointed while the new plan starts
            try:
                load_manifest(path)  # bad input: a one-line error before anything starts
            except InputError as e:
                raise ReloadError(f"cannot reload: {e}", 400) from None
            self.generation += 1
            log.info("event=reload_start manifest=%s generation=%d", path, self.generation)
            metrics = self.current.metrics
            try:
                new = await self.open_plan(path, self.generation)
            except Exception as e:  # noqa: BLE001 - whatever failed, the old plan serves on and the reason is told
                metrics.reloads.labels("failed").inc()
                log.exception("event=reload_open_failed manifest=%s", path)
                raise ReloadError(f"cannot reload: the new plan did not start: {e}") from None
            try:
                await self._ready(new)
            except ReloadError:
                metrics.reloads.labels("failed").inc()
                await new.close()
                raise
            report = await self._switch(self.current, new, path)
            metrics.reloads.labels("ok").inc()
            metrics.reload_pause.observe(report.pause_ms / 1e3)
            self.manifest_path = path
            self.serving = directory
            self.reloads += 1
            freeze_heap()  # once the new plan serves: one full collection, not one per few seconds of serving
            for hook in self.after_reload:
                try:
                    await hook()
                except Exception:  # noqa: BLE001 - the reload happened; what failed after it is told in the log
                    log.exception("event=after_reload_failed generation=%d", self.generation)
            return report

    async def _ready(self, new: PlannedService) -> None:
        bad = incompatible(self.current, new)
        if bad:
            raise ReloadError(f"cannot reload: model(s) {', '.join(bad)} change their input or output tensors; "
                              "clients would break (serve them under another name, or restart the sidecar)", 409)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(new.ready(m) for m in new.names()):
            if time.monotonic() > deadline:
                down = [m for m in new.names() if not new.ready(m)]
                raise ReloadError(f"cannot reload: the new plan's model(s) {', '.join(down)} are not in service "
                                  f"after {READY_TIMEOUT_S:.0f} s (are their Triton servers launched?)")
            await asyncio.sleep(0.05)

    async def _switch(self, old: PlannedService, new: PlannedService, path: Path) -> ReloadReport:
        old_urls = {s.grpc_url for s in old.fleet.servers.values()}
        new_urls = {s.grpc_url for s in new.fleet.servers.values()}
        for m, stats in old.answers.stats.items():  # statistics carry on across the reload
            if m in new.answers.stats:
                new.answers.stats[m] = stats
        t_stop = now_us()
        await old.stop_dispatching()
        flushed = False
        if old_urls & new_urls:  # shared servers: their batches must finish before new reservations start
            await self._flush(old)
            flushed = True
        handed, failed = self._hand_over(old, new)
        self.current = new
        pause_ms = (await new.next_step_us() - t_stop) / 1e3
        if not flushed:
            await self._flush(old)
        flush_ms = (now_us() - t_stop) / 1e3
        more, failed_late = self._hand_over(old, new)  # retries of old batches that failed meanwhile
        removed = await old.close()
        report = ReloadReport(str(path), self.generation, pause_ms, flush_ms, handed + more, failed + failed_late,
                              sorted(new_urls - old_urls), sorted(old_urls - new_urls), removed, new.front_us)
        log.info("event=reloaded manifest=%s generation=%d pause_ms=%.1f flush_ms=%.1f handed_over=%d failed=%d "
                 "servers_added=%s servers_removed=%s shm_regions_removed=%d front_us=%g", path, self.generation,
                 pause_ms, flush_ms, report.handed_over, len(report.failed), ",".join(report.servers_added) or "-",
                 ",".join(report.servers_removed) or "-", removed, new.front_us)
        return report

    @staticmethod
    async def _flush(old: PlannedService) -> None:
        tasks = list(old.executor.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=FLUSH_TIMEOUT_S)

    @staticmethod
    def _hand_over(old: PlannedService, new: PlannedService) -> tuple[int, list[str]]:
        """Move the old driver's queued rows to the new one; those of models the new plan lacks fail."""
        now = now_us()
        keep, failed = [], []
        for row in old.driver.take_queued():
            if new.has(row.model):
                keep.append(row)
            else:
                why = f"model '{row.model}' is not in the reloaded plan"
                old.answers.fail(row.call, ServeError(grpc.StatusCode.UNAVAILABLE, why))
                failed.append(why)
        new.driver.adopt(keep, now)
        return len(keep), failed


def manifest_directory(path: Path) -> Path:
    """The generated directory a manifest path names (the directory itself, or the manifest file in it)."""
    p = Path(path).resolve()
    return p if p.is_dir() else p.parent


def reload_on_signal(plans: PlanSwitch) -> asyncio.Task:
    """SIGHUP: reload from the manifest path the sidecar was started with (errors are logged; it serves on)."""
    async def run() -> None:
        try:
            await plans.reload()
        except ReloadError as e:
            log.warning("event=reload_failed reason=%s", e)
    return asyncio.ensure_future(run())
