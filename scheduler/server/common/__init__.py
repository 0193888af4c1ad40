"""What every part of the sidecar shares: errors with Triton's status codes, KServe v2 tensor codecs, the
shared-memory regions clients register, and the Prometheus metrics."""
