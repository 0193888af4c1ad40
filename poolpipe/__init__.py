"""poolpipe: pooled-pipeline CNN serving on heterogeneous GPU clusters, on top of NVIDIA Triton."""

from poolpipe_common import poolpipe_version

__version__ = poolpipe_version()
