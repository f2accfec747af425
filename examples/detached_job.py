"""Start a computation on a cluster, walk away, and collect its result from another process.

    python examples/detached_job.py submit       # creates cluster "pi", spawns the job, exits
    python examples/detached_job.py collect 1    # any later process: waits for job 1, prints it

The submitting process can exit, or be killed, right after the id is printed: the job runs in
the cluster's queue (``skyward queue pi`` lists it) and its result waits there for the collector.
Here the collector then ends the cluster; a real one would keep it for the next job.
"""

import random
import sys

import skyward as sky


@sky.compute
def estimate_pi(samples: int) -> float:
    """A Monte Carlo estimate of pi, seeded by the node it runs on."""
    rng = random.Random(sky.instance_info().node)
    inside = sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(samples))
    return 4 * inside / samples


def submit() -> None:
    with sky.ComputePool(name="pi", nodes=2, idle_minutes=30) as pool:
        job = pool.spawn(estimate_pi(200_000), broadcast=True)  # returns at once
        print(f"submitted job {job.id} to cluster {job.cluster!r}")
    # the block's end detaches; the job goes on without this process


def collect(job_id: int) -> None:
    with sky.ComputePool(name="pi") as pool:
        job = pool.job(job_id)
        estimates = job.result(timeout=600)  # one per node (broadcast=True)
        print(f"job {job.id} {job.status}: pi is about {sum(estimates) / len(estimates):.2f} "
              f"({len(estimates)} nodes)")
        pool.down()


if __name__ == "__main__":
    if sys.argv[1:2] == ["submit"]:
        submit()
    elif sys.argv[1:2] == ["collect"] and len(sys.argv) == 3:
        collect(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
