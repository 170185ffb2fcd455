"""A verdict for people: Markdown (provenance, what needs attention, per-group tables) and plots."""
