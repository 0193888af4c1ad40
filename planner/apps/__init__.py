"""Harpagon's applications: the module scheduler (``harpagon_module``), splitting an application's SLO into module
budgets (``harpagon_split``), and planning a spec's applications into plan.json (``app_plan``)."""
