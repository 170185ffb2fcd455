"""The public backend API (register_backend) and the ``attnkit.backends`` entry-point group.

Entry points are real: each test writes a tiny installed distribution (a ``*.dist-info`` folder
with ``entry_points.txt``, and its module) to a temporary folder on sys.path, as pip would.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attnkit
import attnkit.auto
from attnkit import plugins, registry
from attnkit.builtins import builtin_names
from attnkit.reference import reference_attention

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli where the standard library has no tomllib
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

# Registry and entry-point logic, on the CPU: the CPU CI's run decides it.
pytestmark = pytest.mark.device_independent

_KERNEL = """
import attnkit
from attnkit.reference import reference_attention

def kernel(q, k, v, *, causal, scale, window):
    return reference_attention(q, k, v, causal=causal, scale=scale, window=window).to(q.dtype)
"""


@pytest.fixture
def registry_snapshot(monkeypatch):
    """attnkit's own backends with the entry points not yet read, as a fresh process has them
    (an installed plugin, the example one say, loads again at the first lookup that needs it);
    the registry and the entry-point state as they were restored after the test."""
    own = {name: b for name, b in registry._REGISTRY.items() if name in builtin_names()}
    monkeypatch.setattr(registry, "_REGISTRY", own)
    monkeypatch.setattr(plugins, "_read", False)
    monkeypatch.setattr(plugins, "_broken", {})
    yield
    attnkit.api._forget_plans()  # both memos: a test's backend must not serve the next test's calls


@pytest.fixture
def install(tmp_path, monkeypatch, registry_snapshot):
    """``install(module_source, entry_points)``: a distribution ``toy-dist`` with module
    ``toy_mod`` and the given ``name = value`` lines in the ``attnkit.backends`` group."""

    def make(source: str, entries: dict[str, str], dist: str = "toy_dist") -> str:
        info = tmp_path / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 1.0\n"
        )
        lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
        (info / "entry_points.txt").write_text(f"[attnkit.backends]\n{lines}")
        (tmp_path / "toy_mod.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "toy_mod", raising=False)
        return str(tmp_path)

    return make


def _planted(warned) -> list:
    """The warnings of ``warned`` about the entry points :func:`install` planted (its
    distribution ``toy-dist``), not about whatever else is installed in this environment."""
    return [w for w in warned if "of distribution 'toy-dist'" in str(w.message)]


def _inputs(requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 8, generator=gen, requires_grad=requires_grad)
    k = torch.randn(1, 1, 7, 8, generator=gen, requires_grad=requires_grad)
    v = torch.randn(1, 1, 7, 4, generator=gen, requires_grad=requires_grad)
    return q, k, v


def _assert_matches_oracle(name):
    q, k, v = _inputs()
    out = attnkit.attention(q, k, v, causal=True, backend=name)
    expected = reference_attention(q, k, v, causal=True)
    error = (out.double() - expected).abs().max().item()
    assert error < 1e-6, f"backend {name!r} through the registry differs from the oracle by {error:.3e}"


def test_a_backend_constant_entry_point_registers_its_backend(install):
    install(
        _KERNEL + "backend = attnkit.Backend('under-test', kernel, description='toy kernel')\n",
        {"under-test": "toy_mod:backend"},
    )
    assert "under-test" in attnkit.backend_names()
    assert "under-test" in attnkit.available_backends("cpu")
    _assert_matches_oracle("under-test")


def test_an_entry_point_function_may_return_several_backends_or_register_itself(install):
    install(
        _KERNEL
        + """
def several():
    return [attnkit.Backend('toy-a', kernel), attnkit.Backend('toy-b', kernel)]

def itself():
    attnkit.register_backend('toy-c', kernel)
""",
        {"a": "toy_mod:several", "c": "toy_mod:itself"},
    )
    for name in ("toy-a", "toy-b", "toy-c"):
        _assert_matches_oracle(name)


def test_an_unknown_name_loads_the_entry_points_but_attnkits_own_names_do_not(install):
    install("raise ImportError('the kernel library is missing')\n", {"broken": "toy_mod:backend"})
    q, k, v = _inputs()
    attnkit.attention(q, k, v, backend="naive")  # no plugin is imported for a built-in name
    attnkit.api._PLANNED.clear()
    attnkit.attention(q.double(), k.double(), v.double())  # float64: no compiled memo entry either
    assert plugins._read is False, "looking up attnkit's own backends loaded the entry points"
    with pytest.warns(attnkit.BackendEntryPointWarning), pytest.raises(attnkit.BackendEntryPointError):
        attnkit.attention(q, k, v, backend="broken")


def test_without_triton_its_name_says_why_and_auto_loads_no_plugin(install):
    """In an install where the Triton path cannot be imported, ``"triton"`` is still attnkit's
    name: unavailable on every device with the reason, and ``auto`` (which tries it first) never
    loads the entry points to look for it."""
    path = install(_BROKEN_IMPORT, {"broken": "toy_mod:backend"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, *sys.path])}
    code = (
        "import sys; sys.modules['triton'] = None\n"  # import triton now raises ImportError
        "import attnkit, torch\n"
        "from attnkit import plugins\n"
        "q = torch.ones(1, 1, 2, 4)\n"
        "assert attnkit.attention(q, q, q).sum().item() == 8.0\n"
        "assert plugins._read is False, 'auto loaded the entry points'\n"
        "assert 'triton' not in attnkit.available_backends('cpu')\n"
        "try:\n"
        "    attnkit.attention(q, q, q, backend='triton')\n"
        "except attnkit.BackendUnavailableError as err:\n"
        "    print(err)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    message = result.stdout.strip()
    assert message.startswith("backend 'triton' is unavailable: the Triton path cannot be imported"), message
    assert "install triton" in message, message


_BROKEN_IMPORT = "raise ImportError('the kernel library is missing')\n"


def test_an_entry_points_backend_that_declares_an_auto_rank_is_broken_saying_why(install):
    """``auto`` never loads the entry points, so a rank there would count only once something
    else listed the backends: installing a package never changes what ``auto`` runs."""
    install(
        "from attnkit import Backend\n"
        "from attnkit.reference import naive_attention\n"
        "ranked = Backend('ranked', run=naive_attention, auto_rank=5)\n"
        "plain = Backend('plain', run=naive_attention)\n",
        {"ranked": "toy_mod:ranked", "plain": "toy_mod:plain"},
    )
    with pytest.warns(attnkit.BackendEntryPointWarning) as warned:
        names = attnkit.backend_names()
    assert "plain" in names and "ranked" not in names, names
    messages = [str(w.message) for w in _planted(warned)]
    assert len(messages) == 1 and "cannot declare auto_rank (got 5)" in messages[0], messages
    assert "ranked" not in attnkit.auto.fallback_order()
    with pytest.raises(attnkit.BackendEntryPointError, match="cannot declare auto_rank"):
        attnkit.attention(*_inputs(), backend="ranked")


def test_a_broken_import_is_one_warning_line_and_the_error_whenever_its_backend_is_asked_for(install):
    install(_BROKEN_IMPORT, {"broken": "toy_mod:backend"})
    with pytest.warns(attnkit.BackendEntryPointWarning) as warned:
        names = attnkit.backend_names()
    assert "naive" in names and "broken" not in names, names
    ours = _planted(warned)  # another installed distribution's broken entry point warns too
    assert len(ours) == 1 and "\n" not in str(ours[0].message), [str(w.message) for w in warned]
    q, k, v = _inputs()
    for _ in range(2):  # the error is kept: the plugin is never silently absent later
        with pytest.raises(attnkit.BackendEntryPointError) as caught:
            attnkit.attention(q, k, v, backend="broken")
        message = str(caught.value)
        for part in ("'broken'", "'toy_mod:backend'", "'toy-dist'", "importing it failed", "kernel library"):
            assert part in message, f"{part} missing from: {message}"


def test_a_broken_entry_point_leaves_the_others_working(install):
    install(
        _KERNEL + "backend = attnkit.Backend('under-test', kernel)\n",
        {"broken": "toy_mod:no_such_attribute", "under-test": "toy_mod:backend"},
    )
    with pytest.warns(attnkit.BackendEntryPointWarning, match="'broken'.*no_such_attribute"):
        assert "under-test" in attnkit.available_backends("cpu")
    _assert_matches_oracle("under-test")
    _assert_matches_oracle("naive")
    with pytest.raises(ValueError, match=r"got 'nope';.* not loaded: attnkit.backends entry point 'broken'"):
        attnkit.attention(*_inputs(), backend="nope")  # an unknown name mentions what did not load


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("backend = 42\n", "got 42"),
        ("def backend():\n    return 'under-test'\n", "got 'under-test'"),
        (
            "def backend():\n    raise RuntimeError('no GPU here')\n",
            "calling it failed: RuntimeError('no GPU here')",
        ),
    ],
    ids=["not-a-backend", "returns-garbage", "raises"],
)
def test_an_entry_point_of_the_wrong_kind_is_a_clear_error(install, source, expected):
    install(source, {"bad": "toy_mod:backend"})
    with pytest.warns(attnkit.BackendEntryPointWarning, match="'bad'"):
        attnkit.available_backends("cpu")
    with pytest.raises(attnkit.BackendEntryPointError, match="'bad'") as caught:
        registry.get_backend("bad")
    assert expected in str(caught.value), f"{expected!r} missing from: {caught.value}"


def test_an_entry_point_taking_a_registered_name_is_a_clear_error(install):
    install(_KERNEL + "backend = attnkit.Backend('naive', kernel)\n", {"naive": "toy_mod:backend"})
    with pytest.warns(attnkit.BackendEntryPointWarning, match=r"toy-dist.*'naive' is already registered"):
        attnkit.backend_names()
    assert registry.get_backend("naive").module.startswith("attnkit."), "the plugin replaced attnkit's own"


def test_a_fresh_interpreter_sees_the_plugin(install):
    """Worker processes (paired perf mode, tools) resolve names through the same lazy loading."""
    path = install(
        _KERNEL + "backend = attnkit.Backend('under-test', kernel)\n", {"under-test": "toy_mod:backend"}
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, *sys.path])}
    code = (
        "import attnkit, torch; q = torch.ones(1, 1, 2, 4); "
        "print(attnkit.attention(q, q, q, backend='under-test').sum().item())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "8.0", result.stderr[-2000:]


# --- register_backend ------------------------------------------------------------------------


def _kernel(q, k, v, *, causal, scale, window):
    return reference_attention(q, k, v, causal=causal, scale=scale, window=window).to(q.dtype)


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        ("auto", ValueError, "automatic choice"),
        ("naive", ValueError, "already registered.*replace=True"),
        ("", TypeError, "non-empty str"),
        (3, TypeError, "non-empty str"),
        (" toy", TypeError, "surrounding spaces"),
    ],
)
def test_bad_names_are_refused(registry_snapshot, name, error, match):
    with pytest.raises(error, match=match):
        attnkit.register_backend(name, _kernel)


def test_replace_swaps_a_backend_and_forgets_its_memoised_runs(registry_snapshot):
    q, k, v = _inputs()
    attnkit.register_backend("under-test", _kernel)
    first = attnkit.attention(q, k, v, backend="under-test")
    attnkit.register_backend(
        "under-test", lambda q, k, v, **kw: torch.zeros_like(_kernel(q, k, v, **kw)), replace=True
    )
    second = attnkit.attention(q, k, v, backend="under-test")
    assert first.abs().max() > 0 and torch.equal(second, torch.zeros_like(second)), (
        "the replaced kernel still ran"
    )
    attnkit.unregister_backend("under-test")
    assert "under-test" not in attnkit.backend_names()


def test_exactly_one_of_fn_and_run(registry_snapshot):
    with pytest.raises(TypeError, match="exactly one of fn and run"):
        attnkit.register_backend("under-test", _kernel, run=lambda q, k, v, problem: q)
    with pytest.raises(TypeError, match="fn must be callable"):
        attnkit.register_backend("under-test", "kernel")


def test_the_kernel_receives_the_validated_problems_arguments(registry_snapshot):
    seen = []

    def spy(q, k, v, *, causal, scale, window):
        seen.append((causal, scale, window))
        return _kernel(q, k, v, causal=causal, scale=scale, window=window)

    attnkit.register_backend("under-test", spy)
    q, k, v = _inputs()
    attnkit.attention(q, k, v, causal=True, window=(2, 100), backend="under-test")
    # scale resolved to 1/sqrt(D); the right side hides nothing with causal, so it is normalised away.
    assert seen == [(True, 1.0 / math.sqrt(8), (2, -1))], seen


def test_a_declined_problem_raises_the_kernels_reason_before_it_runs(registry_snapshot):
    calls = []
    attnkit.register_backend(
        "under-test",
        lambda *a, **kw: calls.append(1),
        supports=lambda p: None if p.head_dim % 16 == 0 else f"head_dim {p.head_dim} is not a multiple of 16",
    )
    with pytest.raises(
        attnkit.UnsupportedProblemError, match=r"'under-test'.*head_dim 8 is not a multiple of 16"
    ):
        attnkit.attention(*_inputs(), backend="under-test")
    assert calls == [], "the kernel ran although supports() declined the problem"


def test_forward_only_refuses_gradients_before_the_kernel_runs(registry_snapshot):
    calls = []

    def kernel(q, k, v, **kw):
        calls.append(1)
        return _kernel(q, k, v, **kw)

    attnkit.register_backend("under-test", kernel, forward_only=True)
    with pytest.raises(attnkit.UnsupportedProblemError, match="'under-test' is forward-only"):
        attnkit.attention(*_inputs(requires_grad=True), backend="under-test")
    assert calls == [], "the forward-only kernel ran on inputs that require grad"
    with torch.no_grad():
        out = attnkit.attention(*_inputs(requires_grad=True), backend="under-test")
    assert out.shape == (1, 2, 5, 4) and calls == [1]


def test_forward_only_on_one_device_type_refuses_gradients_there_only(registry_snapshot):
    attnkit.register_backend("under-test", _kernel, forward_only=("cuda",))
    backend = attnkit.registry.get_backend("under-test")
    assert backend.is_forward_only("cuda:0") and not backend.is_forward_only("cpu")
    out = attnkit.attention(*_inputs(requires_grad=True), backend="under-test")
    out.sum().backward()  # on the CPU its gradients flow
    cpu_problem = attnkit.inputs.check_inputs(*_inputs(), False, None, None)
    assert not isinstance(backend.prepared_run(cpu_problem).run, registry._ForwardOnly), (
        "the eager run on the CPU checks gradients it never refuses there"
    )
    with pytest.raises(TypeError, match="forward_only"):
        attnkit.register_backend("under-test-2", _kernel, forward_only="cuda")


def test_chosen_backend_refuses_a_forward_only_path_as_attention_does(registry_snapshot):
    attnkit.register_backend("under-test", _kernel, forward_only=True)
    grads = _inputs(requires_grad=True)
    for call in (attnkit.attention, attnkit.chosen_backend):
        with pytest.raises(attnkit.UnsupportedProblemError, match="'under-test' is forward-only"):
            call(*grads, backend="under-test")
    with torch.no_grad():
        assert attnkit.chosen_backend(*grads, backend="under-test") == "under-test"


def test_auto_passes_a_forward_only_path_over_for_a_training_call(registry_snapshot, monkeypatch):
    ran = []

    def kernel(q, k, v, **kw):
        ran.append("under-test")
        return _kernel(q, k, v, **kw)

    attnkit.register_backend("under-test", kernel, forward_only=True, auto_rank=-1)
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    grads = _inputs(requires_grad=True)
    chosen = attnkit.chosen_backend(*grads)
    assert chosen not in (None, "under-test"), chosen
    attnkit.attention(*grads).sum().backward()
    assert ran == [], "a training call ran the forward-only path"
    with torch.no_grad():
        assert attnkit.chosen_backend(*grads) == "under-test"
        attnkit.attention(*grads)
    assert ran == ["under-test"], "an inference call skipped the path auto ranks first"


def test_a_kernel_returning_the_wrong_shape_is_named(registry_snapshot):
    attnkit.register_backend("under-test", lambda q, k, v, **kw: q)
    with pytest.raises(
        RuntimeError, match=r"backend 'under-test' returned \(1, 2, 5, 8\).*expected a \(1, 2, 5, 4\)"
    ):
        attnkit.attention(*_inputs(), backend="under-test")


def test_a_decline_raised_inside_the_kernel_is_named(registry_snapshot):
    def kernel(q, k, v, **kw):
        raise attnkit.UnsupportedProblemError("no kernel for this head_dim")

    attnkit.register_backend("under-test", kernel)
    with pytest.raises(
        attnkit.UnsupportedProblemError, match=r"backend 'under-test' declined .*: no kernel for this"
    ):
        attnkit.attention(*_inputs(), backend="under-test")


def test_a_failure_against_the_oracle_prints_a_reproducer_that_fails_the_same_way(registry_snapshot):
    """A kernel's author cannot add ``@reproduce_failure`` to a test inside the installed suite:
    the failure prints the lines that repeat the one failing call, and they fail alike."""
    from attnkit.suite.checks import check_against_oracle
    from attnkit.testing.edge_cases import edge

    def three_percent_off(q, k, v, *, causal, scale, window):
        return _kernel(q, k, v, causal=causal, scale=scale * 1.03, window=window)

    attnkit.register_backend("under-test", three_percent_off)
    case = edge(q_len=5, kv_len=7, head_dim=8, value_dim=4, q_heads=2, kv_heads=1, causal=True, seed=3)
    with pytest.raises(AssertionError) as failed:
        check_against_oracle("under-test", case, torch.device("cpu"))
    message = str(failed.value)
    head, marker, code = message.partition("Repeat this one call alone (the same tensors, no hypothesis):\n")
    assert marker and "quantity(ies) outside the tolerance rule" in head, message
    assert "seed=3" in code and "'under-test'" in code, code
    with pytest.raises(AssertionError) as again:
        exec(textwrap.dedent(code), {})
    assert str(again.value).splitlines()[0] == head.splitlines()[0], (str(again.value), head)


# --- the pytest plugin -----------------------------------------------------------------------


def test_an_unknown_backend_option_is_a_usage_error(pytester):
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit.suite.test_contract", "--attnkit-backend", "nope"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*--attnkit-backend: 'nope' is not registered; registered: naive, tiled*"])


def test_a_named_backend_that_cannot_run_on_the_test_device_is_a_usage_error(pytester, registry_snapshot):
    """Every test of it would be a skip, and a run of skips passes: naming it is an error that
    says why, before anything is collected."""
    attnkit.register_backend("nowhere", _kernel, device_support=lambda device: "needs a kind of card")
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit.suite.test_contract", "--attnkit-backend", "nowhere"
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(
        ["*--attnkit-backend nowhere: unavailable on *: needs a kind of card (each of*"]
    )


def test_a_broken_plugin_is_a_warning_for_a_run_that_does_not_use_it(pytester, install):
    install(_BROKEN_IMPORT, {"broken": "toy_mod:backend"})
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit.suite.test_contract", "--attnkit-backend", "naive",
        "-k", "test_nan_in_a_key_reaches_the_rows_that_see_it",
    )  # fmt: skip
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    assert "INTERNALERROR" not in output, output
    result.stdout.fnmatch_lines(["*BackendEntryPointWarning: attnkit.backends entry point 'broken'*"])


def test_asking_for_a_broken_plugins_backend_is_one_error_line(pytester, install):
    install(_BROKEN_IMPORT, {"broken": "toy_mod:backend"})
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit.suite.test_contract", "--attnkit-backend", "broken"
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    result.stderr.fnmatch_lines(
        ["ERROR: --attnkit-backend broken: attnkit.backends entry point 'broken' = 'toy_mod:backend' "
         "of distribution 'toy-dist': importing it failed: ImportError('the kernel library is missing')"]
    )  # fmt: skip


def test_declines_show_as_skips_with_the_kernels_reason(pytester, registry_snapshot):
    """A kernel that declines every float32 problem: the pinned float32 cases are skipped with
    its reason, the drawn ones replaced by other draws, and the run ends with the summary."""
    attnkit.register_backend(
        "picky", _kernel, supports=lambda p: "float32 is not supported" if p.dtype == torch.float32 else None
    )
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit.suite.test_oracle", "--attnkit-backend", "picky", "-rs",
        "-k", "test_backend_matches_reference or single-token or float64",
    )  # fmt: skip
    result.assert_outcomes(passed=3, skipped=1)  # the drawn test, two float64 cases; single-token
    reason = "float32 is not supported"
    result.stdout.fnmatch_lines(
        [
            "*attnkit: declined problems*",
            f"picky: * problem(s) declined: backend 'picky' does not support <problem>: {reason}",
            f"*picky declines this problem: backend 'picky' does not support * dtype=float32: {reason}",
        ]
    )


def test_bisect_finds_a_built_in_benchmark_beside_a_broken_plugin_and_names_the_broken_one(install):
    from attnkit_perf.commands.bisect import BisectError, find_case
    from attnkit_perf.run.backend_choice import grid_cases

    install(_BROKEN_IMPORT, {"broken": "toy_mod:backend"})
    built_in = grid_cases(None, gpu=True)[0].name
    with pytest.warns(attnkit.BackendEntryPointWarning):
        assert find_case(built_in).name == built_in
    asked = built_in.replace(f"[{built_in.split('[')[1].split('-')[0]}-", "[broken-")
    with pytest.raises(BisectError, match=r"entry point 'broken'.*importing it failed"):
        find_case(asked)


def plant_attnkit_install(site: Path) -> None:
    """attnkit's own entry points (pyproject's ``[project.entry-points]``: the pytest plugin's)
    in a ``*.dist-info`` under ``site``, as ``pip install`` writes them: with ``site`` on its path
    a fresh process finds them whether or not attnkit is installed here (the GPU gate runs the
    tests from ``src/`` with nothing installed; the CPU CI installs the package)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf8"))["project"]
    info = site / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
            for group, entries in project["entry-points"].items()
        )
    )


@pytest.mark.parametrize("cache", ["cache", "no-cache"])
def test_a_run_of_the_installed_suite_leaves_nothing_behind(tmp_path, cache):
    """``pytest --pyargs attnkit.suite`` with attnkit installed, from a folder of its own, leaves
    what docs/EXTENDING.md says: pytest's own cache folder and nothing else there, hypothesis'
    files inside it (pytest-benchmark's storage too); nothing at all under
    ``-p no:cacheprovider``; nothing new in the temporary folder either way."""
    scratch, start, site = tmp_path / "tmp", tmp_path / "start", tmp_path / "site"
    scratch.mkdir()
    start.mkdir()
    plant_attnkit_install(site)  # the plugin comes from its entry point, as after pip install
    env = {
        **os.environ,
        "TMPDIR": str(scratch),
        "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
        "HYPOTHESIS_PROFILE": "dev",  # dev keeps a database; every profile caches the code's constants
    }
    for name in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS",
        "PYTEST_XDIST_WORKER",
    ):
        env.pop(name, None)  # as a fresh shell has them: this run's own values are inherited
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "attnkit.suite.test_properties",
         "--attnkit-backend", "naive", "-q", "-x", "-k", "permut",
         *(["-p", "no:cacheprovider"] if cache == "no-cache" else [])],
        cwd=start, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    left = sorted(p.name for p in start.iterdir())
    if cache == "cache":
        assert left == [".pytest_cache"], left
        hypothesis = start / ".pytest_cache" / "d" / "attnkit-hypothesis"
        assert hypothesis.is_dir(), f"no {hypothesis}: {sorted(start.rglob('*'))}"
    else:
        assert left == [], left
    assert list(scratch.iterdir()) == [], f"left in the temporary folder: {list(scratch.iterdir())}"


def test_the_plugin_named_with_p_and_installed_as_an_entry_point_is_registered_once(
    pytester, tmp_path, monkeypatch
):
    """A checkout's runs name the plugin (``-p attnkit_pytest``): where attnkit is installed too,
    its pytest11 entry point of the same name is that plugin, loaded once, with or without -p."""
    import attnkit_pytest

    plant_attnkit_install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    for args in (["-p", "attnkit_pytest"], []):
        manager = pytester.parseconfigure(*args).pluginmanager
        names = [name for name, plugin in manager.list_name_plugin() if plugin is attnkit_pytest]
        assert names == ["attnkit_pytest"], (args, names)
        assert any(plugin is attnkit_pytest for plugin, _ in manager.list_plugin_distinfo()), (
            f"{args}: the plugin was not loaded through its pytest11 entry point"
        )


def test_the_entry_point_tests_pass_beside_another_distributions_broken_entry_point(tmp_path):
    """The tests above count only the entry points they plant: run again in a fresh pytest beside
    a broken ``attnkit.backends`` entry point of another installed distribution, they pass, and
    that run saw the other one."""
    site = tmp_path / "site"
    info = site / "someone_elses_kernel-2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: someone-elses-kernel\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text("[attnkit.backends]\nelsewhere = no_such_module_here:backend\n")
    planting = sorted(
        name
        for name, test in globals().items()
        if name.startswith("test_") and "install" in inspect.signature(test).parameters
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(Path(__file__).relative_to(ROOT)), "-k", " or ".join(planting),
         "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "'someone-elses-kernel'" in output, f"the run did not see the other broken entry point:\n{output}"


def test_declines_that_differ_only_in_their_sizes_are_one_line_with_a_count():
    from attnkit_pytest import summarize_declines

    problem = "B=1 Hq=2 Hkv=2 N=9 M=9 D={d} Dv=32 causal=True dtype=float32"
    declined = [
        ("t1", "k", f"backend 'k' cannot run {problem.format(d=16)}: needs D == Dv, got 16 and 32"),
        ("t2", "k", f"backend 'k' cannot run {problem.format(d=17)}: needs D == Dv, got 17 and 32"),
        ("t3", "k", f"backend 'k' does not support {problem.format(d=8)}: no float64"),
        ("t4", "k", f"backend 'k' does not support {problem.format(d=8)}: no float16"),
    ]
    assert summarize_declines(declined) == [
        "k: 2 problem(s) declined: backend 'k' cannot run <problem>: needs D == Dv, got 16 and 32 "
        "(the numbers vary; the first shown)",
        "k: 1 problem(s) declined: backend 'k' does not support <problem>: no float16",
        "k: 1 problem(s) declined: backend 'k' does not support <problem>: no float64",
    ]


def test_a_perf_worker_reports_a_broken_entry_point_only_for_the_backends_it_times(install):
    from attnkit_perf.measure.worker import _backend_files

    install(_BROKEN_IMPORT, {"broken": "toy_mod:backend"})
    with pytest.warns(attnkit.BackendEntryPointWarning):
        own = _backend_files(["naive"])
    assert set(own["found"]) == {"naive"}, own
    asked = _backend_files(["broken"])
    assert asked["error"].startswith("BackendEntryPointError: attnkit.backends entry point 'broken'"), asked
