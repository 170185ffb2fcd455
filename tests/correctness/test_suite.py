"""The installed suite (:mod:`attnkit.suite`) over every registered backend: the generic
tests of a kernel (the oracle with the tolerance rule, oracle-free properties, the output's form
and NaN propagation) live in the package so that any kernel can run them
(``pytest --pyargs attnkit.suite --attnkit-backend NAME``); collecting them here runs them
over attnkit's own backends with the rest of this folder. The fixtures ``attnkit_backend``
and ``attnkit_device`` come from attnkit's pytest plugin."""

from attnkit.suite.test_contract import (  # noqa: F401
    test_nan_in_a_key_reaches_the_rows_that_see_it,
    test_nan_in_a_query_row_reaches_that_row_only,
    test_output_has_the_callers_dtype_device_and_shape,
)
from attnkit.suite.test_oracle import (  # noqa: F401
    test_backend_matches_reference,
    test_edge_case_matches_reference,
    test_the_everyday_problem_runs_and_matches_the_oracle,
    test_windowed_backend_matches_reference,
)
from attnkit.suite.test_properties import (  # noqa: F401
    test_causal_first_row_is_first_value,
    test_each_row_is_a_convex_combination_of_visible_values,
    test_permuting_keys_with_values_changes_nothing_when_not_causal,
    test_rows_that_see_no_key_are_zero_with_zero_gradient,
    test_scale_zero_gives_mean_of_visible_values,
    test_window_covering_every_key_is_no_window,
    test_window_zero_returns_the_aligned_value,
    test_windowed_row_is_a_convex_combination_of_its_window,
    test_windowed_rows_that_see_no_key_are_zero_with_zero_gradient,
)

# The scale tier's large problems (test_large_problems_match_the_oracle) take 10-30 s per
# backend on a 2-core CPU, over six backends; this folder runs its ladder on a kernel that
# switches paths (test_suite_reach.py) and its pieces (test_scale_tier.py), and
# ``pytest --pyargs attnkit.suite`` runs it whole.
from attnkit.suite.test_scale import (  # noqa: F401
    test_a_sequence_gives_the_same_result_alone_and_inside_a_batch,
    test_both_sides_of_each_dispatch_boundary_match_the_oracle,
    test_log_sum_exp_of_rows_that_see_few_or_no_keys,
    test_repeated_backward_is_bitwise_equal,
)
