"""System shared-memory regions the sidecar owns for hops between Triton servers on one host.

Regions are created once per host, registered with every server of that host, and reused: a producing
server writes its boundary output into a region (requested output with shared-memory parameters), the
next server reads it as input. Names carry the sidecar's pid, so regions of a killed sidecar are found
and removed at the next start.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from runtime.tritonserver import pid_alive, remove_shm_regions

log = logging.getLogger("poolpipe.sidecar.shm")
PREFIX = "poolpipe_sc_"
SHM_DIR = Path("/dev/shm")
ALIGN = 64


def region_name(host: str, index: int, pid: int | None = None, generation: int = 0) -> str:
    """``generation`` > 0: a plan loaded by a reload, whose pool lives beside the previous plan's."""
    safe = "".join(c if c.isalnum() else "-" for c in host)
    gen = f"g{generation}_" if generation else ""
    return f"{PREFIX}{pid or os.getpid()}_{safe}_{gen}{index}"


def owner_pid(name: str) -> int | None:
    """The pid in a region name of ours, else None."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX):].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def stale(name: str) -> bool:
    pid = owner_pid(name)
    return pid is not None and pid != os.getpid() and not pid_alive(pid)


def remove_stale_regions(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink regions left by sidecars that are no longer running; returns their names."""
    return remove_shm_regions(PREFIX, shm_dir, only=stale)


def log_reclaimed(regions: list[str], registrations: list[str]) -> None:
    """One line at start: what dead predecessors left that this sidecar removed (/dev/shm regions, and their
    registrations on the servers, as ``vgpu:name``), and whose it was (their pids)."""
    pids = sorted({p for n in [*regions, *(r.split(":", 1)[-1] for r in registrations)]
                   if (p := owner_pid(n)) is not None})
    log.info("event=reclaimed shm_regions=%d registrations=%d predecessors=%s", len(regions), len(registrations),
             ",".join(map(str, pids)) or "none")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Region:
    name: str  # also the shm key (without the leading '/')
    byte_size: int
    host: str  # the machine whose pool it belongs to

    @property
    def key(self) -> str:
        return "/" + self.name


class HostPool:
    """Free regions of one host, each ``slot_bytes`` large; grows on demand."""

    def __init__(self, host: str, slot_bytes: int, generation: int = 0) -> None:
        self.host = host
        self.slot_bytes = slot_bytes
        self.generation = generation
        self.regions: list[Region] = []
        self.free: list[Region] = []

    def create(self) -> Region:
        name = region_name(self.host, len(self.regions), generation=self.generation)
        # The sidecar never maps these: the servers write and read them. Plain files, no resource tracker.
        fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.slot_bytes)
        finally:
            os.close(fd)
        r = Region(name, self.slot_bytes, self.host)
        self.regions.append(r)
        return r

    def take(self) -> Region | None:
        return self.free.pop() if self.free else None

    def give(self, region: Region) -> None:
        self.free.append(region)

    def destroy(self) -> None:
        for r in self.regions:
            try:
                (SHM_DIR / r.name).unlink()
            except FileNotFoundError:
                pass
        self.regions.clear()
        self.free.clear()
