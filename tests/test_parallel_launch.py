"""launch(): the failing rank is named with its cause, and every rank ends within timeout_s + a few
seconds (gloo, CPU ranks). The time bounds are generous ceilings against a hang, not timings."""
import time

import parallel_ranks as PR  # noqa: I001
import pytest
import torch

from dispatch.parallel import RankError, launch

CAUSES = [("raise", r"rank 1 of 2 raised ValueError: boom from rank 1\n(.|\n)*Traceback(.|\n)*parallel_ranks.py"),
          ("exit", "rank 1 of 2 exited with code 3 before returning a result"),
          ("segfault", "rank 1 of 2 was killed by signal SIGSEGV"),
          ("unpicklable", r"rank 1 of 2 raised RankError: its result \(function\) could not be saved")]


@pytest.mark.parametrize("how, match", CAUSES)
def test_the_failing_rank_is_named_with_its_cause(how, match):
    t0 = time.monotonic()
    with pytest.raises(RankError, match=match):
        launch(PR.rank_behaviour, 2, 1, how, timeout_s=20)
    assert time.monotonic() - t0 < 20  # the peer waiting in a collective did not hold the job


@pytest.mark.parametrize("how", ["hang", "hang_in_collective"])
def test_a_hung_rank_ends_the_job_at_the_timeout(how):
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1 of 2 (did not finish within timeout_s=3 s|raised)") as info:
        launch(PR.rank_behaviour, 2, 1, how, timeout_s=3)
    assert "rank 0" not in str(info.value).splitlines()[0]
    assert time.monotonic() - t0 < 3 + 8  # timeout_s + start-up and teardown


def test_results_of_any_size_come_back_whole():
    a, b = launch(PR.big_result, 2, 24, timeout_s=60)  # 24 MB per rank
    assert a.numel() == b.numel() == 24 * 2**18 and bool((a == 0).all()) and bool((b == 1).all())


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        launch(PR.big_result, 0, 1)
    with pytest.raises(ValueError, match="backend"):
        launch(PR.big_result, 1, 1, backend="mpi")
    with pytest.raises(ValueError, match="picklable"):
        launch(lambda: 0, 1)
    assert torch.equal(launch(PR.big_result, 1, 1)[0], torch.zeros(2**18))
