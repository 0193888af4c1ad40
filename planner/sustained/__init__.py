"""The ``sustained`` objective: plan for the request rate a cluster holds at 99 % SLO attainment, not for the
nominal throughput of its busiest pools.

``queueing`` estimates a plan's sustainable rate in closed form (waits in pools of vGPUs, batch forming, the
per-stage costs the sidecar adds); ``arrivals`` names the arrival process a plan must sustain; ``evaluators``
is the registry of what measures a candidate plan (the closed form here; the simulator, which runs the
shipped driver loop, is offered from scheduler.sim as an entry point); ``search`` plans candidates over SLO
margins and keeps the one that sustains the most; ``rate_target`` finds the cheapest plan that sustains a rate.
"""
