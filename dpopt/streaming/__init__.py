"""Streaming factorizations A = B C (C lower triangular) under multi-participation.

`dpopt.streaming.families.FAMILIES` maps each family name (optimal, sqrt, toeplitz, banded, blt) to its
`optimise` function, importing the family's module on first use.
"""
