"""MILP machinery shared by every planner family: one sparse MILP in array form solved by HiGHS, CBC or Gurobi,
and the solve passes (quick pass, aspiration search on the objective)."""
