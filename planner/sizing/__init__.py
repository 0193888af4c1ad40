"""Instance sizing: PARIS picks vGPU instance sizes from a batch-size PDF (``paris``); the pooled-pipeline MILP
over unequal vGPU sizes (``unequal_milp``), the sizes' timings (``size_profiles``) and where sized vGPUs sit on
their GPUs (``split_slots``)."""
