import torch

from attnkit import attention, available_backends
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor


def test_every_backend_matches_reference_on_one_gqa_causal_problem():
    gen = torch.Generator().manual_seed(0)
    q = make_tensor((2, 4, 37, 24), dtype=torch.float32, device="cpu", generator=gen)
    k = make_tensor((2, 2, 53, 24), dtype=torch.float32, device="cpu", generator=gen)
    v = make_tensor((2, 2, 53, 24), dtype=torch.float32, device="cpu", generator=gen)
    do = torch.randn(2, 4, 37, 24, generator=gen)
    for name in available_backends("cpu"):
        checks = compare_to_reference(
            lambda a, b, c, name=name: attention(a, b, c, causal=True, backend=name),
            q,
            k,
            v,
            causal=True,
            scale=None,
            grad_out=do,
        )
        assert_close_to_reference(name, checks)
