"""The DRA driver's claim lines carry the claim, so JSON logs can be filtered by it."""

from __future__ import annotations

import json
import logging

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.kit.logs import JsonFormatter


def _result(device: str) -> dict[str, str]:
    return {"request": "hca", "driver": DRIVER, "pool": NODE, "device": device}


async def test_prepare_and_unprepare_lines_name_the_claim(
        stage: DraStage, caplog: pytest.LogCaptureFixture) -> None:
    assert stage.kubelet is not None
    fine = stage.api.add_claim("team", "fine", [_result("mlx5-0")])
    ghost = stage.api.add_claim("team", "ghost", [_result("mlx5-99")])
    with caplog.at_level(logging.INFO, logger="rdma_hca"):
        resp = await stage.kubelet.prepare(DRIVER, [("team", fine, "fine"),
                                                    ("team", ghost, "ghost")])
        assert resp.claims[fine].error == "" and resp.claims[ghost].error
        await stage.kubelet.unprepare(DRIVER, [("team", fine, "fine")])
    docs = [json.loads(JsonFormatter().format(r)) for r in caplog.records
            if "claim" in r.__dict__]
    by_claim = {(d["claim"], d["level"], d["message"].split(":")[0]) for d in docs}
    assert ("team/fine", "info", "claim team/fine prepared") in by_claim
    assert ("team/fine", "info", "claim team/fine unprepared") in by_claim
    assert any(c == "team/ghost" and level == "warning" for c, level, _ in by_claim), by_claim
