"""Ports of the generated tritonservers: base+3k.. per host (or free local ports), refused when hosts collide.

Two hosts of a cluster file at one address (two "machines" on loopback, or one machine listed twice)
must not get the same ports, or ``launch`` would start servers that cannot bind. A host with a
``base_port`` needs ``base_port .. base_port + 3·vGPUs - 1``; hosts with ``base_port: 0`` get free
ports of this machine, never one another host at that address already has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from model_repository_gen.cluster_file import Cluster, ClusterHost
from poolpipe_common.errors import InputError
from poolpipe_common.net import free_port

PORTS_PER_VGPU = 3  # http, grpc, metrics
_LOOPBACK_NAMES = {"localhost": "127.0.0.1", "::1": "::1", "ip6-localhost": "::1"}


def interface(address: str) -> str:
    """The address as the servers bind it; ``localhost`` and 127.0.0.1 are one interface."""
    return _LOOPBACK_NAMES.get(address.lower(), address)


def check_collisions(cluster: Cluster, vgpus_per_host: dict[str, int]) -> None:
    """InputError naming the first two hosts at one address whose fixed port ranges overlap."""
    fixed = [(h, h.base_port, h.base_port + PORTS_PER_VGPU * vgpus_per_host[h.name] - 1)
             for h in cluster.hosts if h.base_port and vgpus_per_host.get(h.name)]
    for i, (a, a_lo, a_hi) in enumerate(fixed):
        for b, b_lo, b_hi in fixed[i + 1:]:
            if interface(a.address) == interface(b.address) and a_lo <= b_hi and b_lo <= a_hi:
                raise InputError(f"{cluster.source}: hosts {a.name} and {b.name} collide on ports "
                                 f"{max(a_lo, b_lo)}..{min(a_hi, b_hi)} at {a.address} ({a.name} needs "
                                 f"{a_lo}..{a_hi}, {b.name} {b_lo}..{b_hi}); give them base_ports at least "
                                 f"{PORTS_PER_VGPU} x vGPUs apart, or base_port 0 for free ports")


def _free_ports(host: ClusterHost, count: int, taken: set[int], source: str) -> list[int]:
    picked: list[int] = []
    while len(picked) < count:
        try:
            port = free_port(host.address)
        except OSError:
            raise InputError(f"{source}: host {host.name} has base_port 0 (pick free ports now), which needs its "
                             f"address {host.address} to be on this machine; give a base_port") from None
        if port not in taken:
            taken.add(port)
            picked.append(port)
    return picked


def _next_triple(host: ClusterHost, taken: set[int], source: str) -> tuple[int, int, int]:
    """The first (http, grpc, metrics) of ``host``'s base_port + 3k sequence that nothing at its address uses."""
    base = host.base_port
    while any(p in taken for p in range(base, base + PORTS_PER_VGPU)):
        base += PORTS_PER_VGPU
    if base + PORTS_PER_VGPU > 65536:
        raise InputError(f"{source}: host {host.name} has no free ports above its base_port {host.base_port} "
                         "beside the running deployment; lower its base_port")
    taken.update(range(base, base + PORTS_PER_VGPU))
    return base, base + 1, base + 2


def assign_ports(cluster: Cluster, vgpus: Sequence[tuple[str, ClusterHost]],
                 keep: Mapping[str, tuple[int, int, int]] | None = None,
                 busy: Mapping[str, set[int]] | None = None) -> dict[str, tuple[int, int, int]]:
    """(http, grpc, metrics) per vGPU id; ``vgpus`` are (id, host) in each host's order.

    Beside a running deployment (model_repository_gen.generations): vGPUs in ``keep`` keep those ports, the others
    avoid the ``busy`` ports (interface -> ports), a host with a base_port taking the next free triple of its range."""
    keep, busy = keep or {}, busy or {}
    per_host: dict[str, list[str]] = {h.name: [] for h in cluster.hosts}
    for vid, h in vgpus:
        per_host[h.name].append(vid)
    for h in cluster.hosts:
        if h.base_port and h.base_port + PORTS_PER_VGPU * len(per_host[h.name]) > 65536:
            last = h.base_port + PORTS_PER_VGPU * len(per_host[h.name]) - 1
            raise InputError(f"{cluster.source}: host {h.name} needs ports {h.base_port}..{last} for its "
                             f"{len(per_host[h.name])} vGPU(s); lower its base_port")
    check_collisions(cluster, {name: len(ids) for name, ids in per_host.items()})
    taken: dict[str, set[int]] = {i: set(p) for i, p in busy.items()}  # interface -> ports in use or given
    for h in cluster.hosts:
        if h.base_port and not busy:
            n = PORTS_PER_VGPU * len(per_host[h.name])
            taken.setdefault(interface(h.address), set()).update(range(h.base_port, h.base_port + n))
    for vid, h in vgpus:
        if vid in keep:
            taken.setdefault(interface(h.address), set()).update(keep[vid])
    ports: dict[str, tuple[int, int, int]] = {}
    for h in cluster.hosts:
        for k, vid in enumerate(per_host[h.name]):
            if vid in keep:
                ports[vid] = keep[vid]
            elif h.base_port and busy:
                ports[vid] = _next_triple(h, taken.setdefault(interface(h.address), set()), cluster.source)
            elif h.base_port:
                base = h.base_port + PORTS_PER_VGPU * k
                ports[vid] = (base, base + 1, base + 2)
            else:
                http, grpc, metrics = _free_ports(h, PORTS_PER_VGPU, taken.setdefault(interface(h.address), set()),
                                                  cluster.source)
                ports[vid] = (http, grpc, metrics)
    return ports
