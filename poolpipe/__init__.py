"""poolpipe: pooled-pipeline CNN serving on heterogeneous GPU clusters, on top of NVIDIA Triton."""

__version__ = "0.1.0"
