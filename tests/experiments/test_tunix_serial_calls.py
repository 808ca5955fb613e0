"""How experiments/tunix_serial_calls.py names a process's end, case by case."""

import pytest

from experiments.tunix_serial_calls import ending


@pytest.mark.parametrize("returncode, done, want", [
    (0, 24, "finished"),
    (-11, 3, "crashed during training"),   # a segfault at the 4th learner
    (139, 3, "crashed during training"),   # the same, through a shell
    (-11, 24, "crashed at exit"),          # every learner done, then jax.clear_backends
    (None, 24, "hung at exit"),            # killed at the time limit after the last learner
    (None, 5, "hung during training"),
    (0, 23, "stopped early (23 of 24 learners)"),  # exited cleanly without finishing: not "finished"
    (1, 2, "failed during training (exit code 1)"),  # a Python error, not a signal
])
def test_a_process_end_is_named_from_its_code_and_the_learners_it_finished(returncode, done, want):
    assert ending(returncode, done, 24) == want
