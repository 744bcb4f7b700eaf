"""OpenAI's Conversations API through the `openai` client: conversations and their items made, read, paged, changed
and deleted, each key seeing only its own; `conversation` on `POST /v1/responses` reads a conversation and adds each
turn to it (streamed and background responses too), answering as the conversation sent whole does; and without
`api.store_responses`, the refusals that say so."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest
from stored_responses_fixtures import ASK, KEY_A, KEY_B, client, keyed_server, settled, start

from flint_engine.api.conversation_store import ConversationStore

server = keyed_server("conversations")


def _texts(items) -> list[str]:
    return [item.content[0].text for item in items]


def test_conversations_and_their_items(server) -> None:
    a, b = client(server, KEY_A), client(server, KEY_B)
    conv = a.conversations.create(
        items=[{"type": "message", "role": "user", "content": f"turn {i}"} for i in range(3)],
        metadata={"topic": "sums"},
    )
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "sums"}
    assert a.conversations.retrieve(conv.id).model_dump() == conv.model_dump()
    assert a.conversations.update(conv.id, metadata={"topic": "products"}).metadata == {"topic": "products"}
    # Listed newest first by default, paged; oldest first on asking.
    page = a.conversations.items.list(conv.id, limit=2)
    assert _texts(page.data) == ["turn 2", "turn 1"] and page.has_more
    rest = a.conversations.items.list(conv.id, limit=2, after=page.data[-1].id)
    assert _texts(rest.data) == ["turn 0"] and not rest.has_more
    assert _texts(a.conversations.items.list(conv.id, order="asc").data) == ["turn 0", "turn 1", "turn 2"]
    added = a.conversations.items.create(
        conv.id,
        items=[
            {"type": "message", "role": "assistant", "content": "noted"},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        ],
    )
    assert [item.type for item in added.data] == ["message", "function_call_output"]
    first = added.data[0]
    assert (
        first.id.startswith("msg_") and a.conversations.items.retrieve(first.id, conversation_id=conv.id).id == first.id
    )
    assert a.conversations.items.delete(first.id, conversation_id=conv.id).id == conv.id
    kinds = [item.type for item in a.conversations.items.list(conv.id, order="asc").data]
    assert kinds == ["message", "message", "message", "function_call_output"]
    with pytest.raises(openai.NotFoundError):
        a.conversations.items.retrieve(first.id, conversation_id=conv.id)
    # Another key sees none of it.
    with pytest.raises(openai.NotFoundError):
        b.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        b.conversations.items.list(conv.id)
    assert a.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.conversations.retrieve(conv.id)


def test_bad_conversations_are_refused(server) -> None:
    a = client(server, KEY_A)
    with pytest.raises(openai.BadRequestError) as err:  # a tool this server does not run
        a.conversations.create(items=[{"type": "web_search_call", "id": "ws_1", "status": "completed"}])
    assert "web_search_call" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # more than 20 items a call
        a.conversations.create(items=[{"type": "message", "role": "user", "content": "x"}] * 21)
    with pytest.raises(openai.BadRequestError):
        a.conversations.create(metadata={"k": "v" * 513})
    conv = a.conversations.create()
    with pytest.raises(openai.BadRequestError):  # at least one item
        a.conversations.items.create(conv.id, items=[])
    with pytest.raises(openai.NotFoundError) as err:
        a.responses.create(conversation="conv_missing", input="Hi", **ASK)
    assert err.value.body["param"] == "conversation"
    first = a.responses.create(input="Hi", **ASK)
    with pytest.raises(openai.BadRequestError) as err:
        a.responses.create(conversation=conv.id, previous_response_id=first.id, input="Hi", **ASK)
    assert err.value.body["param"] == "conversation"


def test_responses_read_and_extend_a_conversation(server) -> None:
    a = client(server, KEY_A)
    conv = a.conversations.create()
    first = a.responses.create(conversation={"id": conv.id}, input="What is 7 + 8?", **ASK)
    assert first.conversation.id == conv.id and "15" in first.output_text
    items = a.conversations.items.list(conv.id, order="asc").data
    # The turn's input, then its output items (the thinking, the answer).
    assert items[0].type == "message" and _texts(items[:1]) == ["What is 7 + 8?"]
    assert [i.id for i in items[1:]] == [o.id for o in first.output]
    # The next turn answers as the conversation sent whole does; streamed, it is added as well.
    with a.responses.stream(conversation=conv.id, input="And 2 + 2?", **ASK) as stream:
        second = stream.get_final_response()
    whole = [
        {"role": "user", "content": "What is 7 + 8?"},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"role": "user", "content": "And 2 + 2?"},
    ]
    again = a.responses.create(input=whole, store=False, **ASK)
    assert second.output_text == again.output_text and "4" in second.output_text
    assert second.usage.input_tokens == again.usage.input_tokens
    count = len(a.conversations.items.list(conv.id, limit=100).data)
    assert count == 1 + len(first.output) + 1 + len(second.output)
    # A background response adds its turn when it finishes.
    job = a.responses.create(conversation=conv.id, input="And 3 + 3?", background=True, **ASK)
    done = settled(a, job.id)
    assert done.status == "completed" and done.conversation.id == conv.id
    assert len(a.conversations.items.list(conv.id, limit=100).data) == count + 1 + len(done.output)


def test_without_the_setting_no_conversations_are_kept(tmp_path: Path) -> None:
    server = start()
    try:
        c = client(server, "unused")
        with pytest.raises(openai.NotFoundError) as err:
            c.conversations.create()
        assert "api.store_responses" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:
            c.responses.create(conversation="conv_1", input="Hi", **ASK)
        assert err.value.body["param"] == "conversation" and "api.store_responses" in err.value.body["message"]
    finally:
        server.stop()


def test_conversations_expire_from_their_last_use(tmp_path: Path) -> None:
    now = [time.time()]
    store = ConversationStore(tmp_path, ttl_s=3600, max_bytes=10**9, clock=lambda: now[0], sweep_every_s=float("inf"))
    old = store.create("", [{"role": "user", "content": "old"}], None)["id"]
    used = store.create("", [{"role": "user", "content": "used"}], None)["id"]
    now[0] += 3000
    store.add_items(used, "", [{"role": "user", "content": "again"}])  # its expiry counts from here
    # A line another router is still writing is not read as an item.
    with (tmp_path / f"{used}.items").open("a") as f:
        f.write('{"item": {"id": "msg_half"')
    assert [i["content"][0]["text"] for i in store.items(used, "")] == ["used", "again"]
    now[0] += 1000
    with pytest.raises(Exception, match="not found"):
        store.items(old, "")
    assert store.sweep() == 1 and sorted(p.name for p in tmp_path.iterdir()) == [f"{used}.items", f"{used}.json"]
