"""A run's decision parameters: the thresholds, the false-alarm budget split over the run's
benchmarks, and each benchmark's own threshold from its A/A noise
(:func:`attnkit_perf.decide.gate.benchmark_threshold`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from attnkit_perf.decide import gate
from attnkit_perf.formats.noise import host_noise_name


@dataclass
class RunPolicy:
    """``noise``: benchmark name -> A/A log-ratio sd bound (:mod:`attnkit_perf.decide.noise`);
    ``confirmed``: whether a slowdown must show on two independent measurements to fail (paired
    mode re-measures every suspect on fresh processes of both sides; stored mode re-measures only
    the head against the same recorded baseline, whose own deviation both share)."""

    thresholds: gate.Thresholds
    confirmed: bool
    noise: dict[str, float] = field(default_factory=dict)
    benchmark_count: int = 0

    @property
    def alpha(self) -> float:
        return gate.per_benchmark_alpha(self.thresholds, self.benchmark_count)

    @property
    def noise_k(self) -> float:
        """A/A standard deviations a benchmark's threshold clears (:func:`gate.noise_z`)."""
        if self.thresholds.noise_k is not None:
            return self.thresholds.noise_k
        return gate.noise_z(self.alpha, self.confirmed)

    def threshold_for(self, name: str) -> float:
        """A benchmark's threshold; a host-metric name (:func:`host_noise_name`) gets the host
        metric's, whose practical floor is ``Thresholds.host_slower``."""
        t = self.thresholds
        if name.endswith(host_noise_name("")):
            t = dataclasses.replace(t, slower=t.host_slower)
        return gate.benchmark_threshold(t, self.noise.get(name), self.alpha, self.confirmed)

    def host_threshold_for(self, name: str) -> float:
        """The threshold of benchmark ``name``'s host metric."""
        return self.threshold_for(host_noise_name(name))

    def _practical(self, name: str) -> float:
        host = name.endswith(host_noise_name(""))
        return self.thresholds.host_slower if host else self.thresholds.slower

    def noise_notes(self) -> list[str]:
        """The benchmarks whose A/A noise keeps them from being guarded at the practical threshold."""
        noisy = sorted(n for n in self.noise if self.threshold_for(n) > 2 * self._practical(n))
        if not noisy:
            return []
        return [
            f"too noisy to guard at the practical threshold ({self.thresholds.slower:.1%}; host metrics "
            f"'{host_noise_name('')}': {self.thresholds.host_slower:.1%}): their threshold, "
            f"{self.noise_k:.2f} A/A standard deviations, is over twice it: " + ", ".join(noisy)
        ]

    @staticmethod
    def budget_notes(rows) -> list[str]:
        """The benchmarks left unsettled by an effort too small to show "slower" at all (the
        rank test's smallest p over n pairs is 2^-n; over n and m samples 1/C(n+m, n)): a
        slowdown there could not have failed, whatever its size."""
        blind = sorted(
            r.name
            for r in rows
            if r.outcome == "inconclusive" and r.evidence.get("slower_reachable") is False
        )
        if not blind:
            return []
        return [
            f"WARNING: {len(blind)} benchmarks stopped where 'slower' was out of reach of their "
            "alpha (raise --attnkit-budget-s, or run fewer benchmarks): " + ", ".join(blind)
        ]

    def as_dict(self) -> dict:
        """The verdict's ``thresholds`` block."""
        t = self.thresholds
        return {
            "slower": t.slower,
            "run_alpha": t.run_alpha,
            "per_benchmark_alpha": self.alpha,
            "memory_rel": t.memory_rel,
            "memory_abs_bytes": t.memory_abs_bytes,
            "host_slower": t.host_slower,
            "host_count_slower": t.host_count_slower,
            "kept_abs_bytes": t.kept_abs_bytes,
            "noise_k": self.noise_k,
            "fail_on_inconclusive": t.fail_on_inconclusive,
            "out_of_time": "fail" if t.fail_out_of_time else "pass",
            "allow_dropped": t.allow_dropped,
        }
