"""Capacity and cost planning: the least-cost plan that serves given rates under the SLOs (``least_cost``) and the
exact search over GPU counts it uses for one or two GPU types (``cost_search``)."""
