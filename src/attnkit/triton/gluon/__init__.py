"""Gluon kernels of the Triton path for Hopper (sm_90): the warp-specialized backward, a dK/dV
pass and a dQ pass (:mod:`.hopper_backward`), launched by :mod:`.backward_launch`."""
