import multiprocessing as mp

import numpy as np

from rlfleet.wire.shm import ArraySpec, SharedArrays, layout_from_json, layout_to_json


def _child(name, layout_json):
    blk = SharedArrays.attach(name, layout_from_json(layout_json), untrack=False)
    blk["obs"][:] = 7.0
    blk["flag"][1] = True
    blk.close()


def test_child_process_writes_are_seen_by_owner():
    layout = {"obs": ArraySpec((4, 3), "float32"), "flag": ArraySpec((4,), "bool")}
    blk = SharedArrays.create(layout)
    try:
        p = mp.get_context("spawn").Process(target=_child, args=(blk.name, layout_to_json(layout)))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        assert np.all(blk["obs"] == 7.0) and blk["flag"].tolist() == [False, True, False, False]
    finally:
        blk.close()
