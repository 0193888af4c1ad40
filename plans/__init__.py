"""The planning documents at the bottom of the house: the planning spec (models, cluster, SLOs, applications),
``plan.json`` (pools, pipelines, rates), the arrivals a plan is measured under, and how a plan's vGPU splits map to
slots. The generator, the runtime, the scheduler core's readers and the simulator read these; planning sits above.
"""
