"""A measuring process of paired mode: one side's attnkit, the suite's timing protocol.

Started by :mod:`attnkit_perf.measure.paired_session` as ``python -m attnkit_perf.measure.worker`` with
``PYTHONPATH`` naming this package first and then one side's ``src`` (the base's or the
head's), so the two sides never share imports or allocators (they share one Triton cache:
:mod:`attnkit_perf.measure.paired_session` says why that is safe). It reads one JSON
request per line on stdin and answers one JSON line on the stdout it was started with (Python's
own ``sys.stdout`` goes to stderr, so a library's prints cannot corrupt the protocol):

=============================================  ======================================================
request                                        answer
=============================================  ======================================================
``{"op": "identify", "backends"}``             ``{"ok", "attnkit_file", "provenance", "backends"}``:
                                               ``backends`` (when named) says where each
                                               one's module was imported from
``{"op": "prepare", "case": {...}, "seed"}``   build the case's inputs and call it (which compiles
                                               or loads its kernels, on any core):
                                               ``{"ok", "kept_bytes"}``, or
                                               ``{"ok": false, "unsupported": why}``
``{"op": "plan"}``                             warm the prepared case up and plan the rounds, on
                                               the measuring core: ``{"ok", "reps",
                                               "estimate_s", "peak_bytes", "host_share",
                                               "min_bytes", "flops"}``
``{"op": "measure", "rounds", "reps",``       ``{"ok", "samples"}`` (seconds per call, one a round;
``"warm_rounds"}``                             the first ``warm_rounds`` are run and dropped)
``{"op": "host", "batches"}``                  the host metric (:func:`attnkit_perf.measure.host.
                                               host_per_call`): ``{"ok", "per_call_s",
                                               "cpu_per_call_s", "batches", "dropped"}``
``{"op": "count", "repeats"}``                 the host work of one call, counted ``repeats`` times
                                               (:func:`attnkit_perf.measure.host.host_count`):
                                               ``{"ok", "instructions", "c_calls", "fastpath",
                                               "repeatable", "counts", "environment"}``
``{"op": "fingerprint"}``                      the GPU work of one call (:func:`attnkit_perf.measure.
                                               fingerprint.launch_fingerprint`): ``{"ok",
                                               "fingerprint"}`` (None where none can be taken)
``{"op": "release"}``                          drops the case and frees its memory
=============================================  ======================================================

Any other failure answers ``{"ok": false, "error": text}``; the process keeps serving.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _serve(out) -> None:
    import torch

    import attnkit
    from attnkit import errors

    # A side that cannot run a case says so (unsupported) instead of failing: an unregistered or
    # unavailable backend counts as declined, like a shape the backend rejects.
    declined = tuple(
        getattr(errors, name)
        for name in ("UnsupportedProblemError", "BackendUnavailableError")
        if hasattr(errors, name)
    )
    from attnkit_perf.measure.cases import AUTO_BACKEND, BenchCase
    from attnkit_perf.measure.fingerprint import launch_fingerprint
    from attnkit_perf.measure.host import REPEATS, build_measured, host_count, host_per_call, kept_bytes
    from attnkit_perf.measure.machine import provenance
    from attnkit_perf.measure.timing import (
        L2Flusher,
        host_share,
        measure_samples,
        peak_extra_bytes,
        warm_up_and_plan,
    )

    # Every worker of a session measures on the one core the orchestrator chose (they never
    # measure at once): host-bound timings then do not depend on which core a process landed on.
    # Building a case (and loading its kernels) runs on every core, so that a session's workers
    # start and prepare in parallel.
    cpu = os.environ.get("ATTNKIT_WORKER_CPU")
    pinnable = bool(cpu) and hasattr(os, "sched_setaffinity")
    every_core = os.sched_getaffinity(0) if pinnable else None

    def pin(measuring: bool) -> None:
        if pinnable:
            os.sched_setaffinity(0, {int(cpu)} if measuring else every_core)

    pin(True)
    device = torch.device(os.environ["ATTNKIT_WORKER_DEVICE"])  # set by the paired session
    flusher = L2Flusher(device)
    keep_cache = L2Flusher(device, evict=False)
    # ``built`` holds the case's inputs: it is dropped with the runner, never kept into the next
    # case, whose kept-memory readings would see it freed between them.
    runner, between, case, built = None, flusher, None, None

    def answer(payload: dict) -> None:
        out.write(json.dumps(payload) + "\n")
        out.flush()

    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "identify":
                ident = {"ok": True, "attnkit_file": attnkit.__file__, "provenance": provenance(device)}
                if "backends" in request:
                    ident["backends"] = _backend_files(request["backends"])
                answer(ident)
            elif op == "prepare":
                case = BenchCase(**request["case"])
                built, runner, between = None, None, flusher if case.flushed else keep_cache
                pin(False)
                try:
                    names = getattr(attnkit, "backend_names", None)
                    if names is not None and case.backend not in (*names(), AUTO_BACKEND):
                        raise errors.UnsupportedProblemError(f"backend {case.backend!r} is not registered")
                    built = build_measured(case, device, seed=request.get("seed", 0))
                    runner = built.runner
                    # The first of these calls compiles or loads the kernels, on any core.
                    kept = kept_bytes(runner, device, built.before_calls)
                    runner()
                except declined as err:
                    runner = None
                    answer({"ok": False, "unsupported": str(err)})
                    continue
                finally:
                    pin(True)
                answer({"ok": True, "kept_bytes": kept})
            elif op == "plan":
                if runner is None:
                    raise RuntimeError("plan: no case prepared (send prepare first)")
                plan = warm_up_and_plan(
                    runner, device, between, budget_s=0.0, min_rounds=1, max_rounds=1, warmup_s=0.03
                )
                answer(
                    {
                        "ok": True,
                        "reps": plan.reps,
                        "estimate_s": plan.estimate_s,
                        "peak_bytes": built.graph_peak
                        if built.graph_peak is not None
                        else peak_extra_bytes(runner, device),
                        "host_share": host_share(runner, device, plan.estimate_s, flusher, between),
                        "min_bytes": case.min_bytes,
                        "flops": case.flops,
                    }
                )
            elif op == "measure":
                rounds = request["rounds"] + request.get("warm_rounds", 0)
                samples = measure_samples(runner, device, rounds, between, request["reps"])
                samples = samples[request.get("warm_rounds", 0) :]
                answer({"ok": True, "samples": samples})
            elif op == "host":
                answer({"ok": True, **host_per_call(runner, device, request["batches"])})
            elif op == "count":
                answer({"ok": True, **host_count(runner, request.get("repeats", REPEATS))})
            elif op == "fingerprint":
                answer({"ok": True, "fingerprint": launch_fingerprint(runner, device)})
            elif op == "release":
                runner, built = None, None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                answer({"ok": True})
            else:
                answer({"ok": False, "error": f"unknown request {op!r}"})
        except Exception:  # the orchestrator reports it against the benchmark; keep serving
            answer({"ok": False, "error": traceback.format_exc(limit=8)})


def _backend_files(names: list[str]) -> dict:
    """``{"found": {name: {"module", "file"}}}`` for each of ``names`` this side registers (its
    entry points loaded as any lookup loads them), or ``{"error": why}`` when they fail to load."""
    from attnkit.plugins import broken_entry_points
    from attnkit.registry import backend_names, get_backend

    try:
        known = backend_names()
    except Exception as err:  # importing attnkit's own backends failed on this side
        return {"error": f"{type(err).__name__}: {err}"}
    broken = broken_entry_points()
    asked_broken = [str(broken[name]) for name in names if name in broken and name not in known]
    if asked_broken:  # the entry point of a backend this run times is broken on this side
        return {"error": "BackendEntryPointError: " + "; ".join(asked_broken)}
    found = {}
    for name in names:
        if name in known:
            module = get_backend(name).module
            loaded = sys.modules.get(module) if module else None
            found[name] = {"module": module, "file": getattr(loaded, "__file__", None)}
    return {"found": found}


def main() -> None:
    # The protocol owns the original stdout; everything printed by Python code goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(out)


if __name__ == "__main__":
    main()
