"""Gluon kernels of the Triton path for Hopper (sm_90): the warp-specialized dK/dV pass of the
backward (:mod:`.hopper_backward`, launched by :mod:`.backward_launch`)."""
