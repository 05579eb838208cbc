"""Matrices printed in the seed papers' worked examples, shared by the tests that check them."""

from __future__ import annotations

import numpy as np

# Seed 000, Section 1: cells (NY, NJ, CA, WA); q1 = 2 NJ + CA + WA, q2 = NJ + 2 WA, q3 = NY + 2 CA + 2 WA.
LRM_W = np.array([[0, 2, 1, 1], [0, 1, 0, 2], [1, 0, 2, 2]], dtype=float)
# The strategy shown there measures NJ, WA, q1' = NY/3 + CA and q2' = 2 NY / 3 ...
LRM_A = np.array([[0, 1, 0, 0], [0, 0, 0, 1], [1 / 3, 0, 1, 0], [2 / 3, 0, 0, 0]])
# ... and answers q1 = q1' + 2 NJ + WA - q2'/2, q2 = NJ + 2 WA, q3 = 2 q1' + 2 WA + q2'/2.
LRM_B = np.array([[2, 1, 1, -0.5], [1, 2, 0, 0], [0, 2, 2, 0.5]])

# Seed 001, Example 1 (Section 4.2), as printed: W, the constructed W~ and B with W = B W~.
EX1_W = np.array(
    [
        [0.3657, 0, 0.9812, 0],
        [0, 0.0645, 0, 0],
        [0, 0.5879, 0.7602, 0],
        [0, 0, 0, 0.7310],
        [0, 0.7313, 0, 0],
        [0, 0, 0.7122, 0.9053],
    ]
)
EX1_W_TILDE = np.array([[0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]], dtype=float)
EX1_B = np.array(
    [
        [0, 0.9812, 0.3657, 0],
        [0.0645, 0, 0, 0],
        [0.5879, 0.7602, 0, 0],
        [0, 0, 0, 0.7310],
        [0.7313, 0, 0, 0],
        [0, 0.7122, 0, 0.9053],
    ]
)
