"""Edge fault handling without I/O: what a request carries for the worker to cancel it
when nobody follows its stream."""

from __future__ import annotations

import pytest

from services.edge.config import EdgeSettings
from services.edge.openai_api import ChatBody, CompletionBody


@pytest.mark.parametrize("resumable", [False, True])
def test_only_requests_a_disconnect_cancels_carry_an_unfollowed_grace(resumable: bool) -> None:
    completion = CompletionBody.model_validate(
        {"model": "m", "prompt": "x", "resumable": resumable}
    )
    chat = ChatBody.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "resumable": resumable}
    )
    for body in (completion, chat):
        req = body.to_request("cmpl-1", "acme", 4, unfollowed_grace_s=7.5)
        # A resumable request lives on without a follower: its client may come back.
        assert req.reply.unfollowed_grace_s == (None if resumable else 7.5)
        assert req.reply.redis and req.reply.kafka_topic is None


def test_the_grace_is_an_edge_setting() -> None:
    assert EdgeSettings.from_env({}).unfollowed_grace_s == 10.0
    assert EdgeSettings.from_env({"TW_UNFOLLOWED_GRACE_S": "2.5"}).unfollowed_grace_s == 2.5
    with pytest.raises(ValueError, match="TW_UNFOLLOWED_GRACE_S"):
        EdgeSettings.from_env({"TW_UNFOLLOWED_GRACE_S": "0"})
