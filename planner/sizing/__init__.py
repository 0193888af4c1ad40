"""Instance sizing: PARIS picks vGPU instance sizes from a batch-size PDF (``paris``); the pooled-pipeline MILP
over unequal vGPU sizes (``unequal_milp``) and the sizes' timings (``size_profiles``); where sized vGPUs sit on
their GPUs is plans.split_slots, which the generator and the simulator read too."""
