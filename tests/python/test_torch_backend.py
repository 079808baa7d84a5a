"""The torch.distributed backend "gradstream" in real processes: every collective and dtype
exact (reduce and all-to-all among them), async work completing by itself, more groups, clear
errors, a dead rank."""
import pytest


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_dtype_is_exact(ranks, n):
    out = ranks(n, "collectives").check()
    assert out.results[0]["checked"] > 50


@pytest.mark.parametrize("shm", ["1", "0"])
def test_async_work_completes_without_wait_and_groups_are_separate(ranks, shm):
    out = ranks(3, "asynchronous", env={"GS_SHM": shm}).check()
    assert out.results[0]["order"] == list(range(6))


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_all_to_all_and_barrier_are_exact(ranks, n):
    out = ranks(n, "rooted_and_alltoall").check()
    assert out.results[0]["checked"] == 7 * n * 3


def test_a_communicator_splits_into_halves(ranks):
    out = ranks(3, "comm_split").check()
    assert [r["size"] for r in out.results] == [2, 1, 2]


def test_bad_input_raises_a_clear_error(ranks):
    ranks(2, "bad_input").check()


def test_a_dead_rank_raises_in_the_others_within_the_timeout(ranks):
    out = ranks(3, "dead_rank", timeout=90, env={"GS_TEST_PG_TIMEOUT": "20"})
    assert out.codes[2] == 3, out.outputs[2][-2000:]
    for r in (0, 1):
        assert out.codes[r] == 0, out.outputs[r][-4000:]
        res = out.results[r]
        assert res["elapsed"] < 20, res
        assert res["destroy"] < 15, res
        assert "rank 2" in res["message"], res["message"]
