"""MILP machinery shared by every planner family: one sparse MILP in array form solved by HiGHS, CBC or Gurobi,
the two-seed HiGHS race, and the solve passes (quick pass, aspiration search on the objective)."""
