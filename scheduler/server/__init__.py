"""The scheduler sidecar (``poolpipe serve``), by role; each sub-package imports only those below it.

- ``app`` and ``serve_cli``: the process (front ends, metrics endpoint, plan, signals) and its command line.
- ``front/``: what clients talk to: the KServe v2 gRPC and HTTP front ends, the router and pass-through,
  the admin endpoints (reload, plan).
- ``control/``: changing the plan while serving: reload, automatic re-planning.
- ``planned/``: the planned service: where the sidecar runs the core's batches (``planned/executor.py``:
  stacks a batch's inputs, sends each stage call), the Triton fleet, calibration, client calls and answers.
- ``common/``: what all of them share: errors with Triton's status codes, tensor codecs, clients' shared-memory
  regions, metrics.
"""
