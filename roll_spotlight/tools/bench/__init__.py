"""`spotlight bench all`: every benchmark of the project in one run, and the report they feed.

Modules: ``planner_bench`` (the exploration planner against uniform and oracle allocation), ``regroup``
(warm SP regroup against a cold restart), ``emulate`` (the claim's cluster shapes through the live
system on emulated GPUs, beside the simulator), ``convergence`` (measured iterations-to-target on the tiny task, under a wall-clock
budget), ``headline`` (measured iterations x simulated time and cost per iteration, against the
project's targets), ``paper`` (the paper's reported numbers, cited), ``plots`` and ``report``
(``benchmarks/results/REPORT.md``), ``suite`` (the orchestration and the CLI ``main``).
Importing this package imports no torch, ray or matplotlib.
"""
