"""A model of where a candidate's time goes, from the profile's measured costs.

Per batch of B samples, the training process spends the step (B / ceiling), what
it costs to receive the batch from a worker (nothing extra without workers, where
it makes the batch itself) and the device-side stages; each worker spends B / (its
per-core rate) plus the collate and hand-over (into shared memory and sent, for a
process: the profile's pace of one worker over ready samples). A pipeline goes at
the pace of its slowest part:

- the training process: step + receive + finish (+ the whole worker side without
  workers);
- the workers together: (worker side + collate) / workers;
- on a CPU, the cores: every CPU-second of a batch, the step's and the workers',
  shared by the usable cores (the step and the workers run on the same cores).

Thread workers are modelled as processes with a thread's cheaper receive; what
they lose to the GIL shows in the model's measured error, which the search uses
as its margin. prefetch, persistent workers, the order and the start method do
not change the steady pace in this model; the search tunes them around the
structures the model ranks. With several ranks each has its share of the cores,
and the node's rate is ranks x one rank's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from raytune_loader.profile import Profile
from raytune_loader.space import LoaderConfig, structure


@dataclass(frozen=True)
class Prediction:
    samples_per_s: float
    bound: str  # what sets the pace: "step", "workers" or "cores"
    cpus: float  # processes busy: the training process and its workers, per rank


@dataclass(frozen=True)
class CostModel:
    profile: Profile
    ceilings: dict[int, float]  # samples/s of the step on a resident batch, by batch size
    cuda: bool = False
    ranks: int = 1

    def predict(self, config: LoaderConfig, cores: float | None = None) -> Prediction | None:
        """The candidate's samples/s (the node's: all ranks), or None where the profile
        lacks its structure or the batch size has no ceiling. ``cores``: another node
        (usable CPUs), for estimates; the profile's node by default."""
        side, receiving = structure(config).worker_side, structure(config).receiving
        per_core = self.profile.per_core.get(side)
        ceiling = self.ceilings.get(config.batch_size)
        if not per_core or not ceiling:
            return None
        scale = config.batch_size / self.profile.batch_size
        batch = config.batch_size
        step = batch / ceiling
        finish = self.profile.finish_s.get(side, 0.0) * scale
        collate = self.profile.collate_s.get(side, 0.0)
        if config.num_workers:  # what a worker of this kind pays to hand a batch over
            collate = max(collate, self.profile.hand_over_s.get(receiving, 0.0))
        worker = batch / per_core + collate * scale
        rank_cores = (cores or self.profile.cores) / self.ranks
        if config.num_workers == 0:
            main = step + worker + finish
            parts = {"step": main}
            cpu_seconds = main
        else:
            receive = self.profile.receive_s.get(receiving, 0.0) * scale
            main = step + receive + finish
            parts = {"step": main, "workers": worker / config.num_workers}
            cpu_seconds = main + worker
        if not self.cuda:  # the step and the workers share the cores
            parts["cores"] = cpu_seconds / max(1.0, rank_cores)
        bound = max(parts, key=lambda k: parts[k])
        return Prediction(
            samples_per_s=self.ranks * batch / parts[bound],
            bound=bound,
            cpus=1.0 + config.num_workers,
        )


def median_error(pairs: list[tuple[float, float]]) -> float | None:
    """The median of |predicted - measured| / measured over (predicted, measured) pairs."""
    errors = [abs(p - m) / m for p, m in pairs if m > 0]
    return statistics.median(errors) if errors else None


def what_if(model: CostModel, config: LoaderConfig, cores: list[int]) -> list[dict[str, object]]:
    """Estimates for ``config``'s structure on nodes of other sizes: per rank, a worker
    per core of its share (threads or processes as tuned; on a CPU the training step
    shares those cores, as the model counts), from the same measured per-core costs."""
    out: list[dict[str, object]] = []
    for count in cores:
        workers = max(1, int(count // model.ranks)) if config.num_workers else 0
        resized = config if workers == config.num_workers else LoaderConfig.from_dict(
            {**config.kwargs(), **{k: getattr(config, k) for k in ("transfer", "decode",
             "workers", "access", "batching")}, "num_workers": workers},
        )  # fmt: skip
        found = model.predict(resized, cores=count)
        if found is not None:
            out.append({
                "cores": count, "workers_per_rank": workers, "estimate": True,
                "samples_per_s": round(found.samples_per_s, 1), "bound": found.bound,
            })  # fmt: skip
    return out
