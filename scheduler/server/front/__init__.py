"""The sidecar's front ends: KServe v2 over gRPC and HTTP, the router that sends each call to the planned
service or the pass-through Triton, and the admin endpoints. Nothing here schedules or runs a batch."""
