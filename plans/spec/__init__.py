"""The planning problem as the user writes it: the spec (cluster, limits, models with SLOs), its applications
(DAGs of the models with one end-to-end SLO) and the cluster's unequal vGPU sizes, loaded and validated."""
