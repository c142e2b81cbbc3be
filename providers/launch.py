"""Run a worker inside a lease's resources, whatever the pool behind the broker.

On the simulated pool a lease is bookkeeping: its workers run as local processes, so the
command line is left as it is. On Slurm a lease is an allocation (``Lease.allocation``
carries its job id), and its workers must run as steps of that allocation, so that Slurm
places them on the lease's nodes, gives them its GPUs (``CUDA_VISIBLE_DEVICES``) and kills
them when the lease ends::

    argv = launch_argv(lease, ["process_worker_pool.py", ...])
    subprocess.Popen(argv, ...)

gives ``srun --jobid=N --overlap ... process_worker_pool.py ...`` for a Slurm lease: one task
per node of the lease (``--het-group=0-K`` when the lease spans K+1 nodes with unequal pieces,
each a component of a heterogeneous job). ``--overlap`` lets several workers share the allocation's CPUs.

On the local backend (``bursar serve --backend local``) a lease is a set of this machine's
CPUs and GPUs: ``launch_argv`` puts ``python -m bursar.providers.local_exec`` in front of the
worker, which pins it to the lease's CPUs, joins the lease's cgroup where there is one, and
sets ``CUDA_VISIBLE_DEVICES`` and the OpenMP/BLAS thread counts (:func:`local_env`) before it
execs the worker. One process runs the worker on all the lease's CPUs, whatever its nodes
(NUMA domains of the one machine).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["is_local", "is_slurm", "launch_argv", "local_env", "slurm_job_id"]


def _allocation(lease: Any) -> Mapping[str, str]:
    if isinstance(lease, Mapping):
        return lease
    return getattr(lease, "allocation", None) or {}


def is_slurm(lease: Any) -> bool:
    """True when the lease (a client ``Lease`` or its ``allocation`` map) is a Slurm one."""
    return _allocation(lease).get("backend") == "slurm"


def is_local(lease: Any) -> bool:
    """True when the lease (a client ``Lease`` or its ``allocation`` map) is a local one."""
    return _allocation(lease).get("backend") == "local"


def local_env(lease: Any) -> dict[str, str]:
    """The environment a local lease's worker gets (empty for any other lease): the thread
    counts, ``CUDA_VISIBLE_DEVICES`` and the lease's marker."""
    from bursar.providers.local_exec import lease_env

    a = _allocation(lease)
    return lease_env(a) if is_local(a) else {}


def slurm_job_id(lease: Any) -> int | None:
    a = _allocation(lease)
    return int(a["job_id"]) if is_slurm(a) and a.get("job_id") else None


def launch_argv(lease: Any, argv: Sequence[str], *, srun: str = "srun") -> list[str]:
    """The command line that runs ``argv`` once on each node of ``lease``.

    ``lease`` is a client ``Lease`` (or its ``allocation`` map). Unchanged when the lease has
    no Slurm allocation (the simulated pool)."""
    argv = list(argv)
    if not argv:
        raise ValueError("argv is empty: give the worker's command line")
    a = _allocation(lease)
    if is_local(a):
        if not a.get("run_dir") or not a.get("lease_id"):
            raise ValueError(f"the lease's local allocation has no run_dir/lease_id: {dict(a)}")
        wrapper = [sys.executable, "-m", "bursar.providers.local_exec"]
        return [*wrapper, "--run-dir", a["run_dir"], "--lease", a["lease_id"], "--", *argv]
    if not is_slurm(a):
        return argv
    job = a.get("job_id")
    if not job:
        raise ValueError(f"the lease's Slurm allocation has no job_id: {dict(a)}")
    groups = int(a.get("het_groups") or 1)
    nodes = int(a.get("node_count") or 1)
    out = [srun, f"--jobid={job}", "--overlap", "--quiet"]
    if groups > 1:
        out.append(f"--het-group=0-{groups - 1}")
    else:
        out += [f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    return out + argv
