"""PPipe's pooled pipelines: whole-pipeline candidates, the column MILP and the reductions and DPs that make it
fast, the assembled plan, the np / dart-r baselines, and the paper's reference plans."""
