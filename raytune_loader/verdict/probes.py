"""The findings' probes: the tuned configuration's variants, measured after verification.

:func:`probe` measures the variants :func:`raytune_loader.verdict.findings.probe_configs` names
(``persistent_workers`` flipped, alone; ``worker_threads`` and ``in_order`` flipped,
beside the tuned configuration in rotated rounds), through the search's measurer, so
the findings can say what each knob does to the tuned loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measurer import Measurer
from raytune_loader.measuring.records import TrialRecord
from raytune_loader.progress import Progress
from raytune_loader.verdict.findings import TUNED, Rules, probe_configs
from raytune_loader.verdict.selection import Candidate, fitting, select
from raytune_loader.verdict.verify import Verified, verify

PROBE_REPEATS = 3  # rounds of the probes that compare speeds with the tuned configuration


def probe(
    verified: Verified,
    job: TrialJob,
    objective: str,
    records: Sequence[TrialRecord],
    measurer: Measurer,
    progress: Progress,
    rules: Rules,
) -> Verified:
    """The probes of the tuned configuration, measured after verification (each alone;
    beside the tuned one, in rotated rounds, where they compare speeds)."""
    selection = select(verified.candidates, objective)
    if selection is None:
        return verified
    flips = probe_configs(selection.winner, records, rules)
    if not flips:
        return verified
    starts = {k: c for k, c in flips.items() if k == "persistent_workers"}
    speeds = {k: c for k, c in flips.items() if k not in starts}  # beside the tuned one
    rounds = [(starts, 1)] + ([({TUNED: fitting(selection.winner), **speeds}, PROBE_REPEATS)]
                              if speeds else [])  # fmt: skip
    what = "probing the tuned loader (findings)"
    total = sum(len(configs) * repeats for configs, repeats in rounds)
    probes: list[Candidate] = []
    for configs, repeats in rounds:
        done = sum(len(c.outcomes) for c in probes)
        progress.count(what, done, total)
        probed = verify(
            replace(job, ceilings={}), configs, repeats, measurer,
            on_measured=lambda n, _, *rest, done=done: progress.count(what, done + n, total),
            slot_base=10**6 + done,  # --cold: samples no trial nor verification run read
        )  # fmt: skip
        probes += probed.candidates
    return replace(verified, probes=probes)
