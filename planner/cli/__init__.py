"""``poolpipe plan`` and ``poolpipe plan sweep``: their flags, the commands, and the printed plan report.
Nothing in the planner families imports this package."""
