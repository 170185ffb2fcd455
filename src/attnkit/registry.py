"""The backend registry: every path attnkit can dispatch to, and why one may be unavailable.

A backend is described once, by a :class:`Backend`: its functions and every property the
dispatchers, the installed suite and the perf gate read. attnkit's own backends
(:mod:`attnkit.builtins`), a plugin calling :func:`register_backend`, and an installed package's
entry point (:mod:`attnkit.plugins`) all describe theirs that way and enter through one door.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import torch

from attnkit.boundaries import DispatchBoundary, check_boundaries
from attnkit.device import absent_reason, default_device
from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem, records_backward
from attnkit.plugins import broken_entry_points, load_entry_points
from attnkit.prepared import PreparedRun, RunFn
from attnkit.traits import NO_DEVICE, Declaration, DeviceTypes, declared_on, device_type

DeviceCheck = Callable[[torch.device], "str | None"]
ProblemCheck = Callable[[AttentionProblem], "str | None"]
Prepare = Callable[[AttentionProblem], PreparedRun | RunFn]
#: ``cache_forward(q, k_cache, v_cache, cache, block_table) -> out | None``: attention over a KV
#: cache read in place (:func:`attnkit.attention_with_kvcache`), or None where the backend
#: leaves the call to the gathered route (each sequence's keys gathered, then its run).
CacheForward = Callable[..., "torch.Tensor | None"]


def _always(_) -> None:
    return None


#: The Backend fields declared per device type (:mod:`attnkit.traits`).
_PER_DEVICE = (
    "forward_only",
    "deterministic",
    "deterministic_when_enforced",
    "batch_invariant",
    "interpreted_on",
    "compiled_per_class",
)
#: The Backend fields that must be callables when given.
_CALLABLES = ("fn", "run", "supports", "device_support", "prepare", "cache_forward")


@dataclass(frozen=True)
class Backend:
    """One attention path, described once: what :func:`register_backend` takes as keywords, and
    what an ``attnkit.backends`` entry point names (:mod:`attnkit.plugins`). Every field is
    checked when the Backend is made (a TypeError or ValueError naming ``Backend(name)`` and the
    field), before anything registers it.

    Args:
        name: a non-empty string without surrounding spaces, not ``"auto"``.
        fn: ``fn(q, k, v, *, causal, scale, window) -> out`` with q (B, Hq, N, D), k (B, Hkv, M, D),
            v (B, Hkv, M, Dv) in one dtype on one device (any strides; ``Hq % Hkv == 0``) and out
            (B, Hq, N, Dv) in q's dtype. ``causal`` is a bool (bottom-right: query i sees key j iff
            ``j <= i + M - N``), ``scale`` a float (the default 1/sqrt(D) already resolved),
            ``window`` None or the normalised (left, right) pair of :attr:`AttentionProblem.window`.
            Gradients flow through autograd unless ``forward_only``. Inputs reach ``fn`` only
            after attnkit validated them and ``supports`` accepted them; its output's shape, dtype
            and device are checked.
        run: advanced, instead of ``fn``: ``run(q, k, v, problem)`` receiving the validated
            :class:`~attnkit.AttentionProblem` (the form attnkit's own backends use).
        supports: ``supports(problem) -> None | str``: None to accept an
            :class:`~attnkit.AttentionProblem`, or the reason it declines (raised as
            :class:`~attnkit.UnsupportedProblemError` before ``fn`` runs, shown by the suite as a
            skip). Cheap: it runs once per call signature.
        description: one line shown next to the name.
        forward_only: the device types on which ``fn`` has no backward (in the form of
            ``deterministic`` below: True for every one): there a call whose inputs require grad
            (with grad mode on) raises UnsupportedProblemError before ``fn`` runs
            (:meth:`gradient_refusal`), ``backend="auto"`` passes the backend over for it, and
            the perf gate times no training pass.
        device_support: advanced: ``device_support(device) -> None | str``, why the backend cannot
            run on a device at all (it then leaves :func:`available_backends`).
        prepare: advanced: ``prepare(problem) -> run`` (a :class:`~attnkit.prepared.PreparedRun`
            or a plain run function, which describes nothing) made once per call signature, with
            the work that depends on the problem alone done up front (:meth:`prepared_run`); the
            prepared run may describe itself for the compiled fast path (:mod:`attnkit.prepared`).
        dispatch_boundaries: the sizes at which the kernel switches code paths, as
            :class:`~attnkit.DispatchBoundary` objects: the suite runs problems just below, at
            and just above each. Without any, it still runs sizes spread log-uniformly up to its
            scale tier's limits.
        deterministic: the device types on which the same inputs give bitwise-equal outputs and
            gradients on every call (:meth:`is_deterministic`): True (every device type), False
            (none), or a collection such as ``("cpu", "cuda")``. The suite repeats the backward
            at scale and compares bitwise on those devices.
        batch_invariant: the device types (in the same form) on which a sequence's output and
            gradients are bitwise the same alone and inside a batch (:meth:`is_batch_invariant`);
            elsewhere the suite requires them within the tolerance rule.
        deterministic_when_enforced: the device types on which the backward is deterministic
            only under ``torch.use_deterministic_algorithms(True)`` (not ``warn_only``), where
            PyTorch runs its deterministic kernels or raises: ``backend="auto"`` keeps the
            backend in that mode (:func:`attnkit.auto.deterministic_order`).
        interpreted_on: the device types on which the backend runs through an interpreter
            (attnkit's ``triton`` on the CPU; :meth:`is_interpreted`): ``backend="auto"`` passes
            it over there, and the suite gives it smaller problems.
        compiled_per_class: the device types on which the backend compiles a kernel the first
            time it sees each problem class (dtype, head counts and dims, scale, mask): seconds
            per class, as FlexAttention through torch.compile (:meth:`is_compiled_per_class`).
            There the suite draws a quarter of its hypothesis examples (at least 2), so that one
            test's examples do not each pay a compilation.
        auto_rank: where ``backend="auto"`` tries the backend when no measured table decides
            (:func:`attnkit.auto.fallback_order`): the backends that declare a rank, lowest
            first (equal ranks in the order they registered), after the paths the GPU model's
            table measured for the problem; None (the default): ``auto`` never falls back to it.
            attnkit's own: ``triton`` 10, ``sdpa`` 20, ``tiled`` 30, ``naive`` 40. Not for an
            installed package's entry point (``auto`` never loads them): a program that wants
            such a backend in ``auto`` registers it with a rank itself.
        cache_forward: advanced: ``cache_forward(q, k_cache, v_cache, cache, block_table)``
            (:data:`CacheForward`), attention over a KV cache read in place
            (:func:`attnkit.attention_with_kvcache`; ``cache`` its validated
            :class:`~attnkit.kvcache_inputs.CacheProblem`), returning the output or None to leave
            the call to the gathered route (each sequence's keys gathered, then :attr:`call`).

    The per-device fields are stored as :class:`~attnkit.traits.DeviceTypes`, ``supports`` and
    ``device_support`` as functions (accepting everything when not given). Made from them:
    :attr:`call`, the run :func:`attnkit.attention` calls (``run``, or ``fn`` behind the checks
    of its output, behind the forward-only guard), and :attr:`module`, the module that defines
    ``fn`` or ``run`` (e.g. a plugin's kernel module: the perf gate checks that each side of a
    comparison imported it from that side's source).
    """

    name: str
    fn: Callable[..., torch.Tensor] | None = None
    _: KW_ONLY
    run: RunFn | None = None
    supports: ProblemCheck | None = None
    description: str = ""
    forward_only: Declaration = False
    device_support: DeviceCheck | None = None
    prepare: Prepare | None = None
    dispatch_boundaries: tuple[DispatchBoundary, ...] = ()
    deterministic: Declaration = False
    deterministic_when_enforced: Declaration = False
    batch_invariant: Declaration = False
    interpreted_on: Declaration = False
    compiled_per_class: Declaration = False
    auto_rank: int | None = None
    cache_forward: CacheForward | None = None
    #: Made from the fields above (see the class's docstring).
    call: RunFn = dataclasses.field(init=False, repr=False, compare=False)
    module: str | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = f"Backend({self.name!r})"
        _check_name(self.name)
        if (self.fn is None) == (self.run is None):
            raise TypeError(f"{owner}: give exactly one of fn and run")
        for label in _CALLABLES:
            value = getattr(self, label)
            if value is not None and not callable(value):
                raise TypeError(f"{owner}: {label} must be callable, got {type(value).__name__}")
        if not isinstance(self.description, str):
            raise TypeError(f"{owner}: description must be a str, got {type(self.description).__name__}")
        if self.auto_rank is not None and (type(self.auto_rank) is not int):
            raise TypeError(f"{owner}: auto_rank must be an int or None, got {self.auto_rank!r}")
        # One stored form whatever was given (True, False, a collection of device types).
        made = {label: declared_on(owner, label, getattr(self, label)) for label in _PER_DEVICE}
        made["dispatch_boundaries"] = check_boundaries(owner, self.dispatch_boundaries)
        made["supports"] = self.supports or _always
        made["device_support"] = self.device_support or _always
        call = self.run if self.fn is None else _KeywordRun(self.name, self.fn)
        forward_only = made["forward_only"]
        made["call"] = call if forward_only == NO_DEVICE else _ForwardOnly(self.name, forward_only, call)
        defined = self.fn if self.fn is not None else self.run
        defined = getattr(defined, "func", defined)  # a functools.partial: its function's module
        made["module"] = getattr(defined, "__module__", None)
        for label, value in made.items():
            object.__setattr__(self, label, value)

    def is_deterministic(self, device: torch.device | str, *, enforced: bool = False) -> bool:
        """Whether repeated calls on ``device`` (a torch.device, ``"cuda:0"``, or a device type)
        give bitwise-equal outputs and gradients; ``enforced``: under
        ``torch.use_deterministic_algorithms(True)`` (not ``warn_only``), where PyTorch runs its
        deterministic kernels or raises."""
        return device in self.deterministic or (enforced and device in self.deterministic_when_enforced)

    def is_batch_invariant(self, device: torch.device | str) -> bool:
        """Whether a sequence's output and gradients on ``device`` are bitwise the same alone and
        inside a batch."""
        return device in self.batch_invariant

    def is_interpreted(self, device: torch.device | str) -> bool:
        """Whether the backend runs through an interpreter on ``device`` (orders of magnitude
        slower than a compiled path)."""
        return device in self.interpreted_on

    def is_compiled_per_class(self, device: torch.device | str) -> bool:
        """Whether the backend compiles a kernel on ``device`` for each new problem class."""
        return device in self.compiled_per_class

    def is_forward_only(self, device: torch.device | str) -> bool:
        """Whether the backend computes no gradients on ``device``."""
        return device in self.forward_only

    def gradient_refusal(self, q, k, v, problem: AttentionProblem) -> str | None:
        """Why this call cannot run here: it records a backward (grad mode on, an input requiring
        grad) on a device where the backend is forward-only; else None."""
        return _gradient_refusal(self.name, self.forward_only, q, k, v, problem)

    def prepared_run(self, problem: AttentionProblem) -> PreparedRun:
        """The eager run for ``problem``: ``prepare(problem)``, or :attr:`call` without one."""
        if self.prepare is None:
            run = self.call
            if isinstance(run, _ForwardOnly) and not self.is_forward_only(problem.device):
                run = run.run  # forward-only on other device types only: no check on this one's calls
            return PreparedRun(run)
        prepared = self.prepare(problem)
        prepared = prepared if isinstance(prepared, PreparedRun) else PreparedRun(prepared)
        if self.is_forward_only(problem.device):
            return prepared._replace(run=_ForwardOnly(self.name, self.forward_only, prepared.run))
        return prepared


_REGISTRY: dict[str, Backend] = {}


def register_backend(
    name: str, fn: Callable[..., torch.Tensor] | None = None, *, replace: bool = False, **declarations
) -> Backend:
    """Register an attention implementation under ``name``; ``attention(..., backend=name)``
    then runs it, and the correctness suite tests it (``pytest --pyargs attnkit.suite
    --attnkit-backend NAME``).

    ``name``, ``fn`` and ``declarations`` are :class:`Backend`'s fields (``supports``,
    ``description``, ``forward_only``, ``dispatch_boundaries``, ``deterministic``, ...; see
    there), checked before anything registers. ``replace``: allow replacing a registered backend
    of the same name (not allowed otherwise: a ValueError).

    Returns:
        The registered :class:`Backend`.
    """
    return _add_backend(Backend(name, fn, **declarations), replace=replace)


#: True while the installed packages' entry points load (:func:`_load_entry_points`).
_loading_entry_points = False


def _load_entry_points() -> None:
    """Load the ``attnkit.backends`` entry points (once per process), marking that what
    registers meanwhile comes from an installed package."""
    global _loading_entry_points
    _loading_entry_points = True
    try:
        load_entry_points(Backend, _add_backend)
    finally:
        _loading_entry_points = False


def _add_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Register ``backend``, a :class:`Backend` already made: where every registration ends,
    :func:`register_backend`'s and an entry point's (:func:`attnkit.plugins.load_entry_points`)."""
    if _loading_entry_points and backend.auto_rank is not None:
        # auto never loads the entry points: a rank would count or not by whether something
        # else had listed the backends first. Installing a package never changes what auto runs.
        raise ValueError(
            f"backend {backend.name!r}: an installed package's backend cannot declare auto_rank "
            f"(got {backend.auto_rank!r}): backend='auto' never loads the entry points; a program "
            "ranks it with attnkit.register_backend(..., auto_rank=...)"
        )
    if backend.name in _REGISTRY and not replace:
        raise ValueError(
            f"backend name {backend.name!r} is already registered ({_REGISTRY[backend.name].description}); "
            "pass replace=True to replace it"
        )
    # A replaced backend's memoised runs must not outlive it; a new auto rank changes the order
    # auto's memoised plans fell back through.
    changes_plans = backend.name in _REGISTRY or backend.auto_rank is not None
    _REGISTRY[backend.name] = backend
    if changes_plans:
        _forget_plans()
    return backend


def unregister_backend(name: str) -> None:
    """Remove backend ``name`` (registered by :func:`register_backend`)."""
    get_backend(name)  # the error for an unknown name
    del _REGISTRY[name]
    _forget_plans()


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or name != name.strip():
        raise TypeError(f"backend name: expected a non-empty str without surrounding spaces, got {name!r}")
    if name == "auto":
        raise ValueError("backend name: 'auto' is attention()'s automatic choice, not a registrable name")


class _KeywordRun:
    """The registry's ``run(q, k, v, problem)`` over a public ``fn(q, k, v, *, causal, scale,
    window)``, checking the output's shape, dtype and device (a wrong one is the kernel's bug,
    named as such rather than failing later in a caller); an UnsupportedProblemError the kernel
    raises itself gets the backend's name."""

    def __init__(self, name: str, fn: Callable[..., torch.Tensor]):
        self.name, self.fn = name, fn

    def __call__(self, q, k, v, problem: AttentionProblem) -> torch.Tensor:
        try:
            out = self.fn(q, k, v, causal=problem.causal, scale=problem.scale, window=problem.window)
        except UnsupportedProblemError as err:  # a decline from inside the kernel: say whose
            if repr(self.name) in str(err):
                raise
            raise UnsupportedProblemError(
                f"backend {self.name!r} declined {problem.describe()}: {err}"
            ) from err
        expected = (problem.batch, problem.q_heads, problem.q_len, problem.value_dim)
        if (
            not isinstance(out, torch.Tensor)
            or tuple(out.shape) != expected
            or out.dtype != problem.dtype
            or out.device != problem.device
        ):
            got = (
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
            raise RuntimeError(
                f"backend {self.name!r} returned {got}; expected a {expected} tensor of "
                f"{problem.dtype} on {problem.device} for {problem.describe()}"
            )
        return out


class _ForwardOnly:
    """A run that refuses, before it starts, a call that would need its (missing) backward on the
    device types ``devices``."""

    def __init__(self, name: str, devices: DeviceTypes, run: RunFn):
        self.name, self.devices, self.run = name, devices, run

    def __call__(self, q, k, v, problem: AttentionProblem) -> torch.Tensor:
        reason = _gradient_refusal(self.name, self.devices, q, k, v, problem)
        if reason is not None:
            raise UnsupportedProblemError(reason)
        return self.run(q, k, v, problem)


def _gradient_refusal(name: str, devices: DeviceTypes, q, k, v, problem: AttentionProblem) -> str | None:
    """:meth:`Backend.gradient_refusal` of the backend ``name``, forward-only on ``devices``."""
    if problem.device not in devices:
        return None
    if not records_backward(q, k, v):
        return None
    where = "" if devices.names is None else f" on the {problem.device.type}"
    return (
        f"backend {name!r} is forward-only{where}: it computes no gradients, and these inputs require "
        "grad (call it under torch.no_grad() or on detached tensors)"
    )


#: Called with no argument whenever a backend is replaced or removed, or one declaring an
#: ``auto_rank`` is added: :mod:`attnkit.api` adds the function that drops its memoised plans,
#: which hold the runs of the backends they chose (``auto``'s, from its fallback order).
_CHANGE_LISTENERS: list[Callable[[], None]] = []


def on_backends_changed(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every replacement or removal of a registered backend, and every
    registration of one that declares an ``auto_rank``."""
    _CHANGE_LISTENERS.append(listener)


def _forget_plans() -> None:
    for listener in _CHANGE_LISTENERS:
        listener()


def registered_backends() -> list[Backend]:
    """The backends registered so far, in registration order, without loading the installed
    packages' entry points (what ``backend="auto"`` chooses among)."""
    return list(_REGISTRY.values())


def backend_names() -> list[str]:
    """Every registered backend's name, those of installed plugins (the ``attnkit.backends``
    entry points, loaded on first use) included."""
    _load_entry_points()
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; a :class:`~attnkit.BackendEntryPointError` when the
    entry point of that key is broken, a ValueError listing the valid names for any other."""
    if isinstance(name, str) and name not in _REGISTRY:
        _load_entry_points()
    if not isinstance(name, str) or name not in _REGISTRY:
        raise unknown_backend_error(name)
    return _REGISTRY[name]


def unknown_backend_error(name: object) -> Exception:
    """The error for asking for ``name``, which is not registered: the broken entry point of that
    key if there is one, else a ValueError listing the registered names (and the broken entry
    points, which may have been meant to register it)."""
    broken = broken_entry_points()
    if isinstance(name, str) and name in broken:
        return broken[name]
    others = "".join(f"; not loaded: {err}" for err in broken.values())
    if name == "auto":  # asked of a call that takes one backend (unavailable_reason, get_backend)
        registered = ", ".join(repr(n) for n in _REGISTRY)
        return ValueError(
            f"backend: 'auto' is attention's choice among the backends, not one of them; expected one "
            f"of {registered}{others}"
        )
    valid = ", ".join(repr(n) for n in ["auto", *_REGISTRY])
    return ValueError(f"backend: expected one of {valid}, got {name!r}{others}")


def unavailable_reason(name: str, device: torch.device | str | None = None) -> str | None:
    """Why backend ``name`` cannot run on ``device`` (default: the current default device): the
    device is not on this machine, or the backend declines it."""
    device = default_device() if device is None else _device_argument(device)
    backend = get_backend(name)  # an unknown name is an error, whatever the device
    return absent_reason(device) or backend.device_support(device)


def _device_argument(device: object) -> torch.device:
    """``device`` as a torch.device, or a ValueError naming the argument and what it takes."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device: expected a torch.device or a device string such as 'cpu', 'cuda' or 'cuda:0', "
            f"got {device!r} ({str(err).splitlines()[0]})"
        ) from None


def auto_skip_reason(name: str, device: torch.device | str) -> str | None:
    """Why ``backend="auto"`` passes over ``name`` on ``device`` although it may run there, or
    None. A backend interpreted there (:attr:`Backend.interpreted_on`: Triton on the CPU under
    ``TRITON_INTERPRET=1``, ~1000x slower than any native path) runs only when asked for by name."""
    if get_backend(name).is_interpreted(device):
        return f"on the {device_type(device)} {name} runs interpreted; it runs only when requested by name"
    return None


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Names of the backends usable on ``device`` (default: CUDA if present, else CPU)."""
    return [name for name in backend_names() if unavailable_reason(name, device) is None]
