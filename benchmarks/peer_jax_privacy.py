"""One jax-privacy strategy optimisation, run by the interpreter of a venv that has jax-privacy (not dpopt).

`benchmarks/bench_stream_peers.py` starts this file as a script with that venv's python (`--jax-python PATH`):

    PYTHON benchmarks/peer_jax_privacy.py JOB.json

JOB.json names the optimiser (dense, banded, banded_toeplitz, toeplitz, blt), n, epochs k, the objective (mean or
max), the band or buffer count and a CPU budget in seconds; the file writes C.npy (the dense strategy, float64) and
result.json beside JOB.json. Only jax-privacy's public API is called, each optimiser at its own defaults (step
limits, stopping tests, L-BFGS settings); a CPU budget is enforced through the optimiser's callback where it takes
one (the loss reached at the budget is kept, status "cpu_cap"), and by the parent killing the process otherwise.
The peer's own loss is its fixed-epoch evaluation of C: mean or max of `dense.per_query_error` times
`sensitivity.fixed_epoch_sensitivity(C, k)^2` (its |X|-sum bound, exact where X_pi >= 0).
This file imports nothing from dpopt: the two venvs differ (JAX's numpy pins).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

# One thread for XLA and any BLAS before jax is imported (the parent sets the same; this keeps a direct run honest).
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

OPTIMISERS = ("dense", "banded", "banded_toeplitz", "toeplitz", "blt")


def _stopper(cpu_budget: float, start: float, inner=None):
    """A jax-privacy optimisation callback: stop at `inner`'s test or when the process's CPU passes the budget."""
    state = {"steps": 0, "capped": False, "inner_stop": False}

    def callback(info) -> bool:
        state["steps"] = int(info.step) + 1
        if inner is not None and inner(info):
            state["inner_stop"] = True
            return True
        if time.process_time() - start >= cpu_budget:
            state["capped"] = True
            return True
        return False

    return callback, state


def optimise(job: dict):
    """(C as a numpy array, the optimiser's call as text, steps taken or None, status) for one job."""
    import jax.numpy as jnp
    import numpy as np
    from jax_privacy.matrix_factorization import banded, buffered_toeplitz, dense, toeplitz

    name, n, k, objective = job["optimiser"], int(job["n"]), int(job["epochs"]), job["objective"]
    reduction = jnp.mean if objective == "mean" else jnp.max
    start = time.process_time()
    budget = float(job["cpu_budget"])
    if name == "dense":
        # its default callback is the projected-gradient test; kept, with the budget beside it
        cb, st = _stopper(budget, start, dense.pg_tol_termination_fn)
        C = dense.optimize(n, epochs=k, reduction_fn=reduction, callback=cb)
        call = f"dense.optimize({n}, epochs={k}, reduction_fn=jnp.{objective})"
        max_steps = 10000
    elif name == "banded":
        w = int(job["bands"])
        cb, st = _stopper(budget, start)
        strategy = banded.optimize(n, bands=w, reduction_fn=reduction, callback=cb)
        C = strategy.materialize()
        call = f"banded.optimize({n}, bands={w}, reduction_fn=jnp.{objective})"
        max_steps = 100
    elif name in ("banded_toeplitz", "toeplitz"):
        w = int(job["bands"]) if name == "banded_toeplitz" else n
        coef = toeplitz.optimize_banded_toeplitz(n, bands=w, reduction_fn=reduction)  # takes no callback
        C = toeplitz.materialize_lower_triangular(coef, n)
        call = f"toeplitz.optimize_banded_toeplitz({n}, bands={w}, reduction_fn=jnp.{objective})"
        st, max_steps = None, 250
    elif name == "blt":
        K = int(job["buffers"])
        b = n // k
        cb, st = _stopper(budget, start)
        blt = buffered_toeplitz.optimize(n=n, min_sep=b if k > 1 else 1, max_participations=k, error=objective,
                                         min_buffers=K, max_buffers=K, callback=cb)
        C = blt.materialize(n)
        call = (f"buffered_toeplitz.optimize(n={n}, min_sep={b if k > 1 else 1}, max_participations={k}, "
                f"error='{objective}', min_buffers={K}, max_buffers={K})")
        max_steps = 600
    else:
        raise SystemExit(f"unknown optimiser {name!r}; expected one of {', '.join(OPTIMISERS)}")
    C = np.asarray(C, dtype=np.float64)
    if st is None:
        steps, status = None, "returned"
    else:
        steps = st["steps"]
        status = ("cpu_cap" if st["capped"] else "converged" if st["inner_stop"]
                  else "max_steps" if steps >= max_steps else "returned")
    return C, call, steps, status


def own_loss(C, k: int, objective: str) -> tuple[float, float]:
    """(the peer's loss of C, its sens^2) through its public dense fixed-epoch functions."""
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import dense, sensitivity

    per_query = dense.per_query_error(strategy_matrix=jnp.asarray(C))
    err = float(per_query.mean() if objective == "mean" else per_query.max())
    sens = float(sensitivity.fixed_epoch_sensitivity(jnp.asarray(C), k))
    return err * sens * sens, sens * sens


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: peer_jax_privacy.py JOB.json", file=sys.stderr)
        return 2
    job_path = Path(argv[0])
    job = json.loads(job_path.read_text())
    import jax
    import jax_privacy
    import numpy as np

    jax.config.update("jax_enable_x64", True)  # jax-privacy's recommendation (BufferedToeplitz.build requires it)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    C, call, steps, status = optimise(job)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the evaluation below
    loss, sens2 = own_loss(C, int(job["epochs"]), job["objective"])
    np.save(job_path.parent / "C.npy", C)
    result = {"call": call, "cpu_seconds": cpu, "wall_seconds": wall, "steps": steps, "status": status,
              "own_loss": loss, "own_sensitivity": sens2,
              "peak_mb": peak_mb,
              "versions": {"jax": jax.__version__, "jax_privacy": getattr(jax_privacy, "__version__", "?")}}
    (job_path.parent / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
