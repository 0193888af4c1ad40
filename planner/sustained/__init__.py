"""The ``sustained`` objective: plan for the request rate a cluster holds at 99 % SLO attainment, not for the
nominal throughput of its busiest pools.

``queueing`` estimates a plan's sustainable rate in closed form (waits in pools of vGPUs, batch forming, the
per-stage costs the sidecar adds); ``evaluators`` is the registry of what measures a candidate plan (the
closed form, and the simulator below, which runs the shipped driver loop; the arrivals a plan must sustain are
plans.arrivals); ``search`` plans candidates over SLO
margins and keeps the one that sustains the most; ``rate_target`` finds the cheapest plan that sustains a rate.
"""
