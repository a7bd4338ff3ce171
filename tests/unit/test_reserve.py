"""The coordinator's reserve of room for its records (services/coordinator/reserve.py):
allocated, given back when a record write finds the volume full (the write tried again
in its room), taken again once there is room, and let go as the coordinator stops."""

import errno

import pytest

from services.coordinator.reserve import RoomReserve, write_kept


def test_a_full_volume_spends_the_reserve_on_the_write_and_it_is_taken_again(tmp_path):
    reserve = RoomReserve(tmp_path / ".reserve", 1 << 20)
    assert reserve.keep()
    assert (tmp_path / ".reserve").stat().st_size == 1 << 20
    assert (tmp_path / ".reserve").stat().st_blocks * 512 >= 1 << 20  # allocated, not sparse
    tries = []

    def write():
        tries.append(reserve.path.exists())
        if len(tries) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return "written"

    assert write_kept(reserve, write) == "written"
    assert tries == [True, False]  # the second try, in the reserve's room
    # Spent: a full volume again raises (nothing left to give back).
    with pytest.raises(OSError):
        reserve.write(lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    assert reserve.keep() and reserve.path.exists()  # room again: taken again
    # Another error is not a full volume: raised as it is, the reserve kept.
    with pytest.raises(OSError):
        reserve.write(lambda: (_ for _ in ()).throw(OSError(errno.EACCES, "denied")))
    assert reserve.path.exists()
    reserve.release()
    assert not reserve.path.exists()


def test_without_a_reserve_a_write_is_as_it_is(tmp_path):
    assert write_kept(None, lambda: 7) == 7
    assert not RoomReserve(tmp_path / ".reserve", 0).keep()
