"""InSS-style co-location: vGPUs of different (model, partition) pairs share a physical GPU, latencies inflated
by the interference model and GPU memory a hard limit (``colocate``, its MILP in ``colocate_milp``); what
co-location costs a partition is plans.colocation_costs, shared with the simulator."""
