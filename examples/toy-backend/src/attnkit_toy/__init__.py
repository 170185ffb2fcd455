"""A toy attention kernel registered with attnkit through its ``attnkit.backends`` entry point."""

from attnkit import Backend

from attnkit_toy.kernel import supports, toy_attention

#: What the entry point names: attnkit registers it as the backend ``toy`` on first lookup.
backend = Backend(
    "toy",
    toy_attention,
    supports=supports,
    description="example plugin: chunked pure-PyTorch attention",
)

__all__ = ["backend", "supports", "toy_attention"]
