"""Two torch processes side by side on the machine's cores, with OpenMP's default wait
policy and with ``OMP_WAIT_POLICY=PASSIVE``: what the tests' processes do to each
other (three xdist workers on 2 cores, two trainer ranks on 2 cores).

    python experiments/omp_wait.py [--rounds 2] [--steps 150]

Each process trains the small CNN on one resident batch with torch's default thread
count (one per core), pausing 20 ms every 10 steps as a loop waiting on its data
would. With the default policy an OpenMP thread that finishes its share spins for a
while before it sleeps: alone that saves a wake-up, but beside another process it
burns the core the other one needs. Alone and in pairs, each policy, in rotated
rounds. Writes results/benchmarks/omp_wait.json: the training loop's seconds (the
slower of a pair), median and range, and the ratios. Run it on an otherwise idle
machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from _common import save
from raytune_loader.verdict.selection import rotated

POLICIES = {"default": None, "PASSIVE": "PASSIVE"}
CODE = """
import sys, time, torch
from raytune_loader.measuring.models import small_cnn
model = small_cnn(10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))
start = time.perf_counter()
for step in range(int(sys.argv[1])):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 10 == 0:
        time.sleep(0.02)
print(time.perf_counter() - start)
"""


def _run(policy: str | None, processes: int, steps: int) -> float:
    """The slowest of ``processes`` started together: its training loop's seconds."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    started = [
        subprocess.Popen(
            [sys.executable, "-c", CODE, str(steps)], env=env, stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        for _ in range(processes)
    ]
    seconds = []
    for process in started:
        out, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a training loop failed (exit {process.returncode}); see above")
        seconds.append(float(out.split()[-1]))
    return max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    names = {f"{p}, {case}": (p, n) for p in POLICIES for case, n in (("alone", 1), ("two", 2))}
    runs: dict[str, list[float]] = {name: [] for name in names}
    for round_, name in rotated(list(names), args.rounds):
        policy, n = names[name]
        runs[name].append(seconds := _run(POLICIES[policy], n, args.steps))
        print(f"round {round_ + 1}: {name}: {seconds:.2f}s", flush=True)
    median = {name: statistics.median(values) for name, values in runs.items()}
    save("omp_wait", {
        "median_s": median,
        "range_s": {name: [min(v), max(v)] for name, v in runs.items()},
        "two_over_alone": {p: median[f"{p}, two"] / median[f"{p}, alone"] for p in POLICIES},
        "passive_over_default": {
            case: median[f"PASSIVE, {case}"] / median[f"default, {case}"]
            for case in ("alone", "two")
        },
        "steps": args.steps,
        "method": f"{args.rounds} rotated rounds; each process trains small_cnn at batch 32 with "
                  "torch's default threads, 20 ms pause every 10 steps; a pair's slower loop",
    })  # fmt: skip


if __name__ == "__main__":
    main()
