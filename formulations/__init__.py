"""Declarative CVXPY models of every strategy-selection problem in dpopt.

One module per problem, each with `build(...) -> Model` (a cvxpy.Problem with named variables) and a
way back to a dpopt Strategy; `formulations.solve.solve(model, "clarabel" | "scs" | ...)` solves any
of them (import it as `from formulations.solve import solve`; the package does not re-export it, so
the name `formulations.solve` always means the module):

- mm_approx: (eps, delta) matrix mechanism, exact SDP (seed 002, Section 1.1);
- mm_pure: eps-DP matrix mechanism, convex relaxation (seed 002, Section 1.2) -- a lower bound only;
- lrm: Low-Rank Mechanism, Formulas (7)/(8) of seed 000, alternating convex blocks;
- eigen_design: eigenvector strategy with convex weights (seed 003);
- appendix_b: seed 000 Appendix B in convex form (same optimum as mm_approx);
- per_query: least privacy cost under per-query variance bounds (Xiao et al., PVLDB 2021).
"""
