"""Declarative CVXPY models of every strategy-selection problem in dpopt."""
