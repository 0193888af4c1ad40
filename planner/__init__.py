"""The planner: where each model is cut, which pool of (virtual) GPUs serves each partition, with which batch
and how many vGPUs, written as plan.json.

Sub-packages by family: ``spec`` (the planning spec, its applications and vGPU sizes), ``solvers`` (the MILP in
array form and the solvers), ``ppipe`` (PPipe's pooled-pipeline MILP, its reductions and the np / dart-r
baselines), ``sizing`` (PARIS instance sizing and unequal vGPU sizes), ``colocation`` (InSS-style co-location),
``apps`` (Harpagon: application SLO splits), ``cost`` (the cheapest GPUs for given rates), ``cli``
(``poolpipe plan``). Top level: ``plan_json`` (the plan.json document), ``planners`` (the planner registry),
``compare`` (planners compared over one axis: ``poolpipe plan sweep``).
"""
