"""Properties a backend declares per device type (:mod:`attnkit.traits`): how a declaration is
read and refused, what attnkit's own backends declare, and that the installed suite holds a
backend to a property only on the device types it declares it for."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import Backend, register_backend, unregister_backend
from attnkit.builtins import builtin_names
from attnkit.reference import naive_attention
from attnkit.registry import get_backend
from attnkit.suite.checks import Declines, examples_for_compiled
from attnkit.suite.test_scale import (
    test_a_sequence_gives_the_same_result_alone_and_inside_a_batch as batch_check,
)
from attnkit.suite.test_scale import test_repeated_backward_is_bitwise_equal as determinism_check
from attnkit.tiled import tiled_attention
from attnkit.traits import EVERY_DEVICE, NO_DEVICE, DeviceTypes

CPU = torch.device("cpu")

#: What each of attnkit's backends is expected to declare, per property, as the device types it
#: holds on: the test's expectation (what docs/API.md and docs/TESTING.md promise), not a source
#: anything reads. The suite checks that a declared property holds; this checks that none was
#: dropped. Changing a declaration in attnkit/builtins.py means changing it here, with the reason.
BUILT_IN_DECLARATIONS = {
    # ATen ops without atomics: deterministic wherever they run; batch-invariant only on the CPU
    # (on CUDA cuBLAS picks its kernel by the batch size).
    "naive": {"deterministic": {"cpu", "cuda"}, "batch_invariant": {"cpu"}},
    "tiled": {"deterministic": {"cpu", "cuda"}, "batch_invariant": {"cpu"}},
    "sdpa-math": {"deterministic": {"cpu", "cuda"}},
    # Deterministic only once torch.use_deterministic_algorithms(True) makes PyTorch pick so.
    "sdpa": {"deterministic_when_enforced": {"cpu", "cuda"}},
    "sdpa-flash": {"deterministic_when_enforced": {"cpu", "cuda"}},
    "sdpa-efficient": {"deterministic_when_enforced": {"cpu", "cuda"}},
    "sdpa-cudnn": {},
    # torch.compile builds FlexAttention's kernels for each new problem class, on either device.
    "flex": {"compiled_per_class": {"cpu", "cuda"}},
    # No atomics, compiled on CUDA; the CPU runs it through the Triton interpreter.
    "triton": {"deterministic": {"cpu", "cuda"}, "interpreted_on": {"cpu"}},
}
PROPERTIES = (
    "deterministic",
    "deterministic_when_enforced",
    "batch_invariant",
    "interpreted_on",
    "compiled_per_class",
)


def _fn(q, k, v, *, causal, scale, window):
    return q


def test_every_built_in_has_its_declarations_pinned_here():
    registered = set(builtin_names())
    assert registered == set(BUILT_IN_DECLARATIONS), (
        f"not pinned: {sorted(registered - set(BUILT_IN_DECLARATIONS))}; "
        f"pinned, not attnkit's: {sorted(set(BUILT_IN_DECLARATIONS) - registered)}"
    )


@pytest.mark.parametrize("name", list(BUILT_IN_DECLARATIONS))
def test_each_built_in_declares_its_properties_on_the_device_types_where_they_hold(name):
    try:
        backend = get_backend(name)
    except ValueError:
        pytest.skip(f"{name} is not registered in this install")
    declared = {prop: getattr(backend, prop).names for prop in PROPERTIES}
    expected = {prop: frozenset(BUILT_IN_DECLARATIONS[name].get(prop, ())) for prop in PROPERTIES}
    assert declared == expected, f"{name} declares {declared}, expected {expected}"
    for device in ("cpu", "cuda", "cuda:1", torch.device("cuda", 0), "mps"):
        kind = torch.device(device).type
        answers = {
            "deterministic": backend.is_deterministic(device),
            "enforced": backend.is_deterministic(device, enforced=True),
            "batch_invariant": backend.is_batch_invariant(device),
            "interpreted_on": backend.is_interpreted(device),
            "compiled_per_class": backend.is_compiled_per_class(device),
        }
        deterministic = kind in expected["deterministic"]
        assert answers == {
            "deterministic": deterministic,
            "enforced": deterministic or kind in expected["deterministic_when_enforced"],
            "batch_invariant": kind in expected["batch_invariant"],
            "interpreted_on": kind in expected["interpreted_on"],
            "compiled_per_class": kind in expected["compiled_per_class"],
        }, f"{name} on {device!r}: {answers}"


@pytest.mark.parametrize(
    ("declared", "names"),
    [
        (True, None),
        (False, frozenset()),
        (("cpu",), frozenset({"cpu"})),
        (["cuda", "cpu", "cuda"], frozenset({"cpu", "cuda"})),
        (frozenset({"mps"}), frozenset({"mps"})),
        ((), frozenset()),
    ],
    ids=["true", "false", "cpu", "list-with-a-repeat", "frozenset", "empty"],
)
def test_a_declaration_is_stored_as_the_device_types_it_names(declared, names):
    backend = register_backend("declares", _fn, deterministic=declared, batch_invariant=declared)
    try:
        assert backend.deterministic == backend.batch_invariant == DeviceTypes(names)
        for device in ("cpu", torch.device("cuda", 3), "cuda:0", "mps"):
            expected = names is None or torch.device(device).type in names
            assert backend.is_deterministic(device) == expected, f"{declared!r} on {device!r}"
            assert backend.is_batch_invariant(device) == expected, f"{declared!r} on {device!r}"
    finally:
        unregister_backend("declares")


@pytest.mark.parametrize(
    ("declared", "error", "message"),
    [
        (
            "yes",
            TypeError,
            r"deterministic must be True \(every device type\), False \(none\) or a collection",
        ),
        ("cpu", TypeError, r"deterministic must be True .* such as \('cpu',\); got 'cpu'"),
        (1, TypeError, r"deterministic must be True"),
        (None, TypeError, r"deterministic must be True"),
        ((torch.device("cpu"),), TypeError, r"deterministic must name device types as str"),
        (("gpu",), ValueError, r"deterministic: 'gpu' is not a device type \(Expected one of cpu, cuda"),
        (("cuda:0",), ValueError, r"deterministic: 'cuda:0' names a device, not a device type: write 'cuda'"),
    ],
    ids=[
        "a-word",
        "a-bare-device-type",
        "an-int",
        "none",
        "a-torch-device",
        "an-unknown-type",
        "an-indexed-device",
    ],
)
def test_a_bad_declaration_is_refused_at_registration_naming_the_argument(declared, error, message):
    with pytest.raises(error, match=r"Backend\('bad'\): " + message):
        register_backend("bad", _fn, deterministic=declared)
    with pytest.raises(ValueError, match="expected one of"):
        get_backend("bad")  # nothing was registered


@pytest.mark.parametrize("argument", PROPERTIES)
def test_every_per_device_argument_is_checked(argument):
    with pytest.raises(ValueError, match=rf"Backend\('bad'\): {argument}: 'gpu' is not a device type"):
        register_backend("bad", _fn, **{argument: ("gpu",)})


def test_a_backend_made_directly_and_one_registered_store_the_same_form():
    """register_backend's keywords are Backend's fields: a Backend made directly (an entry
    point's, a test's) normalises its declarations the same way, or says which is wrong, before
    anything registers it."""
    direct = Backend("direct", run=naive_attention, deterministic=("cpu",), interpreted_on=True)
    assert direct.deterministic == DeviceTypes(frozenset({"cpu"})) and direct.interpreted_on == EVERY_DEVICE
    assert Backend("plain", run=naive_attention).batch_invariant == NO_DEVICE
    registered = register_backend(
        "registered", run=naive_attention, deterministic=("cpu",), interpreted_on=True
    )
    try:
        assert registered == Backend(
            "registered", run=naive_attention, deterministic=("cpu",), interpreted_on=True
        )
    finally:
        unregister_backend("registered")
    with pytest.raises(ValueError, match=r"Backend\('direct'\): batch_invariant: 'cuda:1' names a device"):
        Backend("direct", run=naive_attention, batch_invariant=("cuda:1",))


def test_a_per_device_property_has_no_truth_value_of_its_own():
    """``if backend.batch_invariant:`` would answer for no device in particular: it is an error
    naming the way to ask."""
    with pytest.raises(
        TypeError, match=r"has no truth value: ask for a device, e\.g\. backend\.is_deterministic"
    ):
        bool(get_backend("naive").batch_invariant)
    assert str(get_backend("naive").batch_invariant) == "cpu"
    assert str(EVERY_DEVICE) == "every device type" and str(NO_DEVICE) == "no device type"


def _alone_naive_batched_tiled(q, k, v, problem):
    """Exact attention either way, but a batch of several sequences goes through another
    accumulation order than one alone: equal within the tolerance rule, not bitwise."""
    return (tiled_attention if problem.batch > 1 else naive_attention)(q, k, v, problem)


@pytest.fixture
def batch_dependent():
    """``batch_dependent(declared)``: registers a backend whose result depends (in its last
    bits) on the batch around a sequence, declaring ``batch_invariant=declared``."""
    names = []

    def register(declared):
        name = f"batch-dependent-{len(names)}"
        names.append(name)
        register_backend(name, run=_alone_naive_batched_tiled, batch_invariant=declared)
        return name

    yield register
    for name in names:
        unregister_backend(name)


def test_the_batch_invariance_check_applies_only_on_the_declared_device_types(batch_dependent):
    """Declared on CUDA only, a backend on the CPU is held to the tolerance rule, which the
    batch-dependent rounding passes; declared on the CPU, the bitwise check runs there and fails
    naming the device."""
    batch_check(batch_dependent(("cuda",)), CPU)
    with pytest.raises(AssertionError, match=r"declares batch_invariant on cpu, but \["):
        batch_check(batch_dependent(("cpu",)), CPU)


class _DriftingRun:
    """Exact attention whose accumulation order alternates from call to call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, problem):
        self.calls += 1
        return (tiled_attention if self.calls % 2 else naive_attention)(q, k, v, problem)


def test_the_determinism_check_applies_only_on_the_declared_device_types():
    """Declared on CUDA only, the repeated-backward check is skipped on the CPU, saying so;
    declared on the CPU, it runs there and catches a path that drifts between calls."""
    register_backend("drifts", run=_DriftingRun(), deterministic=("cuda",))
    try:
        with pytest.raises(pytest.skip.Exception, match=r"drifts does not declare deterministic on cpu \("):
            determinism_check("drifts", CPU)
        register_backend("drifts", run=_DriftingRun(), deterministic=("cpu",), replace=True)
        with pytest.raises(AssertionError, match=r"drifts: call 2 changed \["):
            determinism_check("drifts", CPU)
    finally:
        unregister_backend("drifts")


@pytest.mark.parametrize("compiled_per_class", [False, True], ids=["compiled-once", "compiled-per-class"])
def test_the_suite_draws_a_quarter_of_its_examples_for_a_backend_compiled_per_class(
    request, compiled_per_class
):
    """Each drawn problem is a new class for such a backend, and pays a compilation."""
    register_backend("compiles", naive_attention, compiled_per_class=compiled_per_class)
    try:
        declines, drawn = Declines("compiles", request), []

        @given(st.integers())
        def check(x):
            declines.run(lambda: drawn.append(x))

        declines.drive(check)
    finally:
        unregister_backend("compiles")
    profile = settings().max_examples
    assert len(drawn) == (examples_for_compiled(profile) if compiled_per_class else profile)
    assert examples_for_compiled(profile) < profile, f"the profile draws {profile} examples"
