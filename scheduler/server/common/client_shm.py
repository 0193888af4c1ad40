"""System shared-memory regions that clients register with the sidecar (Triton's shared-memory extension).

The sidecar maps each region itself, so planned models read inputs from it and write outputs into it
at the registered offsets; the same registration is forwarded to the pass-through Triton so that
pass-through requests naming the region work unchanged.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from scheduler.server.common.errors import ServeError, invalid

SHM_DIR = Path("/dev/shm")


@dataclass
class ClientRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    mm: mmap.mmap = field(repr=False)

    def view(self, offset: int, nbytes: int, what: str) -> memoryview:
        """``nbytes`` at ``offset`` inside the registered window, or a Triton-style error."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.byte_size:
            raise invalid(f"{what}: {nbytes} bytes at offset {offset} exceed the shared memory region "
                          f"'{self.name}' of {self.byte_size} bytes")
        start = self.offset + offset
        return memoryview(self.mm)[start:start + nbytes]


class ClientShmRegistry:
    """Name -> mapped region; the regions belong to the clients, the sidecar never unlinks them."""

    def __init__(self) -> None:
        self.regions: dict[str, ClientRegion] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self.regions:
            raise ServeError(grpc.StatusCode.ALREADY_EXISTS,
                             f"shared memory region '{name}' already in manager")
        path = SHM_DIR / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            raise invalid(f"Unable to open shared memory region: '{key}' ({e.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            if offset < 0 or byte_size <= 0 or offset + byte_size > size:
                raise invalid(f"failed to register shared memory region '{name}': offset {offset} + byte_size "
                              f"{byte_size} exceeds the size {size} of '{key}'")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.regions[name] = ClientRegion(name, key, offset, byte_size, mm)

    def get(self, name: str) -> ClientRegion:
        try:
            return self.regions[name]
        except KeyError:
            raise invalid(f"Unable to find shared memory region: '{name}'") from None

    def unregister(self, name: str = "") -> None:
        """One region, or all when ``name`` is empty (as Triton)."""
        names = [name] if name else list(self.regions)
        for n in names:
            region = self.regions.pop(n, None)
            if region is not None:
                try:
                    region.mm.close()
                except BufferError:  # a view is still alive in an in-flight request; the GC closes it
                    pass

    def close(self) -> None:
        self.unregister()
