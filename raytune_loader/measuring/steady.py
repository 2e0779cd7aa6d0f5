"""The steady state of a measured window: where it starts, the rate it measured, whether
it held.

A loader's workers fill every slot they have while the training loop does not read:
while the workers start, and while the first steps are slow (cuDNN's autotuning,
allocation, ``torch.compile``). A window that starts then is served from that stock
and measures how deep the queue is, not how fast batches are made: the deeper the
queue, the "faster" the loader. Three rules keep the stock out of every figure, and a
fourth keeps the slowest configurations from taking minutes:

1. **The warm-up drains what the loader holds.** After the warm-up steps (on the
   first batch), the loop trains as many more batches as the candidate holds
   (:meth:`~raytune_loader.engines.base.Engine.in_flight`: every slot it has: ready,
   pinned, or in the making) before the window starts, so nothing made while the first
   steps were slow is left for the window; a configuration far below the ceiling may
   stop sooner, once the loop has waited for its next batch (rule 4).
2. **The rate is the slower of consuming and producing.** Every batch carries when its
   worker began reading its first sample and when it finished the batch
   (:class:`~raytune_loader.loaders.batches.Stamped`): the worker's own time for it, not the
   time it waited for a task or a free slot. The window's rate (:class:`Rate`) is its
   samples over the longer of the loop's wall time and the workers' time to make them,
   shared among the workers that make batches at once: a loop served from a stock
   consumes faster than the workers produce, and once the stock is gone training runs
   at what they produce; a loop that is the limit leaves the workers idle, and its own
   time is the longer.
3. **The halves agree.** The window's first half and second half, each measured the
   same way, must be within :data:`STEADY_TOLERANCE` of each other; a window whose
   rate moved is marked not steady, and is not ranked as if it were.
4. **No window is long for nothing.** A window ends before its steps once it has
   lasted :data:`WINDOW_BUDGET` times what its steps take at the ceiling and its halves
   hold the fewest batches a cut half needs (:func:`short_half`: two, and a batch from
   each maker at once) (:func:`over_budget`); the drain before it ends the same way
   once the loop has had to wait a step for its next batch (:func:`drained`). A
   configuration that slow (a rule-of-thumb baseline reading a bucket a request at a
   time) is measured on fewer samples, not on minutes of them: its batches come at the
   pace of its requests, one like the next.

Nothing trains faster than the model on a resident batch (the ceiling) or than its input
pipeline alone: :func:`above_bound` says when a figure beats either beyond
:data:`BOUND_TOLERANCE`, which is a defect to report, not a result.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the stamps' type only: this module stays free of torch
    from raytune_loader.loaders.batches import Stamped

STEADY_TOLERANCE = 0.20  # the halves' rates may differ by this share and still be steady
HALF_BATCHES = 8  # the fewest batches a half needs for its rate to say anything
# ... and a half of a window cut at its budget (at least a batch from each maker at once):
# at 80 ms a request, a baseline's sixteen batches took 23 s of a 30 s trial
SHORT_HALF_BATCHES = 2
BOUND_TOLERANCE = 0.05  # a figure this far above its bound is a defect, not noise
# A window (or a drain) ends once it has lasted this many times what its batches take at
# the ceiling, and holds the batches its halves need: a configuration under a tenth of
# the ceiling (a rule-of-thumb baseline reading a bucket at 19 samples/s, 40 s of a
# search's 176) is measured on fewer samples, still steady or marked, and no window
# takes longer
WINDOW_BUDGET = 10.0


def window_budget_s(samples: int, ceiling: float | None) -> float | None:
    """The longest a window (once its halves can be compared) or a drain (once the loop
    waited a step) of ``samples`` runs (:data:`WINDOW_BUDGET`); None without a ceiling
    (nothing to be held to)."""
    return WINDOW_BUDGET * samples / ceiling if ceiling else None


def short_half(makers: int) -> int:
    """The fewest batches a half of a window cut at its budget holds: two, a batch from
    each of the ``makers`` at once, and no more than a whole window's half needs."""
    return min(HALF_BATCHES, max(SHORT_HALF_BATCHES, makers))


def over_budget(
    batches: Sequence[Consumed], start: float, budget_s: float | None, makers: int
) -> bool:
    """Whether a window of ``batches`` from ``start``, made by ``makers`` at once, may end
    before its steps: it ran past its budget and its halves can be compared."""
    return (
        budget_s is not None
        and len(batches) >= 2 * short_half(makers)
        and batches[-1].ended - start >= budget_s
    )


def drained(waited_s: float, lasted_s: float, budget_s: float | None, step_s: float) -> bool:
    """Whether a drain may end before the stock it could hold: it has lasted ``lasted_s``,
    past its budget, and the loop just waited ``waited_s`` for a batch, longer than a
    step takes (``step_s``: the loop's last, or one at the ceiling, the longer): the
    batch next in order was not ready, so the stock built during the first steps is
    spent (a batch of it comes in well under a step, however slow the step). Batches
    other makers finished out of turn may still be held; the window's rate counts the
    time their makers took (rule 2), not how soon the loop got them."""
    return budget_s is not None and lasted_s >= budget_s and waited_s > step_s


@dataclass(frozen=True)
class Consumed:
    """One batch the loop trained on: its samples, when its step ended (host clock,
    ``time.monotonic``), and its worker's time to make it (None where unknown)."""

    samples: int
    ended: float
    cost_s: float | None

    @classmethod
    def of(cls, stamped: Stamped, samples: int) -> Consumed:
        """A batch just trained on, from its stamps."""
        return cls(samples, time.monotonic(), stamped.made - stamped.started)


@dataclass(frozen=True)
class Rate:
    """A stretch of consumed batches: its samples, the loop's wall time for them, and
    the workers' time to make them (None when no batch has a cost)."""

    samples: int
    consumed_s: float
    produced_s: float | None

    @property
    def wall_s(self) -> float:
        """The stretch as it lasts once no stock is left: the longer of the two."""
        return max(self.consumed_s, self.produced_s or 0.0)

    @property
    def samples_per_s(self) -> float:
        """Samples over the steady wall time."""
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def stretch(self) -> float:
        """The steady wall over the loop's own (1 when the loop is the limit)."""
        return self.wall_s / self.consumed_s if self.consumed_s > 0 else 1.0


def rate(batches: Sequence[Consumed], start: float, makers: int) -> Rate:
    """The rate of ``batches``, consumed from ``start`` on, made by ``makers`` at once:
    the workers' total cost of the batches with one, scaled to all of them, shared
    among the makers."""
    if not batches:
        return Rate(0, 0.0, None)
    consumed = batches[-1].ended - start
    costs = [b.cost_s for b in batches if b.cost_s is not None]
    produced = sum(costs) / makers * len(batches) / len(costs) if costs else None
    return Rate(sum(b.samples for b in batches), consumed, produced)


@dataclass(frozen=True)
class Steadiness:
    """The window's rate as a whole and whether its halves agreed."""

    whole: Rate
    ratio: float | None  # the first half's rate over the second's

    @property
    def steady(self) -> bool | None:
        """Whether the halves agreed (None where the window was too short to tell)."""
        return None if self.ratio is None else within(self.ratio)


def within(ratio: float) -> bool:
    """Two rates ``ratio`` apart, either way, agree within :data:`STEADY_TOLERANCE`."""
    return max(ratio, 1.0 / ratio) <= 1.0 + STEADY_TOLERANCE


def steadiness(
    batches: Sequence[Consumed], start: float, makers: int, least: int = HALF_BATCHES
) -> Steadiness:
    """The window's rate and its halves' ratio (none when a half would hold fewer than
    ``least``: an interim report's, or a short window's; a window cut at its budget
    passes :func:`short_half`)."""
    whole = rate(batches, start, makers)
    half = len(batches) // 2
    if half < least:
        return Steadiness(whole, None)
    first = rate(batches[:half], start, makers)
    second = rate(batches[half:], batches[half - 1].ended, makers)
    if not first.samples_per_s or not second.samples_per_s:
        return Steadiness(whole, None)
    return Steadiness(whole, first.samples_per_s / second.samples_per_s)


def above_ceiling(measured: float | None, ceiling: float | None) -> str | None:
    """A sentence when ``measured`` beats the ceiling beyond noise (:func:`above_bound`)."""
    return above_bound(measured, ceiling, "the ceiling (the model on a resident batch)")


def above_bound(measured: float | None, bound: float | None, what: str) -> str | None:
    """A sentence when ``measured`` beats ``bound`` beyond :data:`BOUND_TOLERANCE`."""
    if not measured or not bound or measured <= bound * (1 + BOUND_TOLERANCE):
        return None
    return (
        f"measured {measured:.0f} samples/s, above {what} ({bound:.0f}, "
        f"+{measured / bound - 1:.0%}): a measurement defect"
    )
