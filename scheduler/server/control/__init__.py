"""Changing the plan while serving: reloading a manifest (SIGHUP, the reload endpoint) and re-planning
automatically when the measured mix leaves the plan's headroom (``serve --replan``)."""
