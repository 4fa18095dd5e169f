"""Incremental detokenization against a byte-level decoder: no split characters, exact stops;
and the tokenizers library's incremental decoder giving the same text as the windowed
decode on the embedded model's tokenizer."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from services.worker.engine.text import Step, TextStream, incremental_decoders

REPLACEMENT = "\ufffd"


class ByteDecoder:
    """A byte-level vocabulary (like byte-level BPE): each id stands for raw UTF-8 bytes, so a
    multi-byte character may be split across ids and decodes to U+FFFD until complete."""

    def __init__(self) -> None:
        self.vocab: list[bytes] = []
        self._ids: dict[bytes, int] = {}

    def ids(self, chunks: Iterable[bytes | str]) -> list[int]:
        out = []
        for chunk in chunks:
            raw = chunk.encode() if isinstance(chunk, str) else chunk
            if raw not in self._ids:
                self._ids[raw] = len(self.vocab)
                self.vocab.append(raw)
            out.append(self._ids[raw])
        return out

    def decode(self, token_ids: Sequence[int], **kwargs: bool) -> str:
        return b"".join(self.vocab[i] for i in token_ids).decode("utf-8", errors="replace")


def single_bytes(text: str) -> list[bytes]:
    return [bytes([b]) for b in text.encode()]


def stream(
    chunks: Iterable[bytes | str], stop: Sequence[str] = (), *, include_stop: bool = False
) -> tuple[list[str], str, TextStream]:
    """Push one token at a time; return the deltas, the flushed tail and the stream."""
    dec = ByteDecoder()
    ts = TextStream(dec, stop, include_stop=include_stop)
    deltas = [ts.push([tid]) for tid in dec.ids(chunks)]
    return deltas, ts.flush(), ts


# --- multi-byte characters -------------------------------------------------------------------
def test_ascii_tokens_stream_as_they_come() -> None:
    deltas, tail, ts = stream(["Hel", "lo", " wor", "ld"])
    assert deltas == ["Hel", "lo", " wor", "ld"]
    assert tail == ""
    assert ts.text == "Hello world"
    assert not ts.stopped


@pytest.mark.parametrize(
    "text", ["café", "中文", "😀", "a😀b中é!", "ééé", "😀😀", "naïve — 日本語 🎉 done"]
)
def test_a_character_split_into_single_bytes_is_sent_whole(text: str) -> None:
    deltas, tail, ts = stream(single_bytes(text))
    assert all(REPLACEMENT not in d for d in deltas), deltas
    assert "".join(deltas) + tail == text
    assert tail == ""
    assert ts.text == text
    # Each character appears in exactly the delta of the token that completes it.
    assert [d for d in deltas if d] == list(text)


def test_split_character_waits_for_its_last_byte() -> None:
    dec = ByteDecoder()
    ts = TextStream(dec)
    a, e1, e2, b = dec.ids([b"caf", b"\xc3", b"\xa9", b"s"])
    assert ts.push([a]) == "caf"
    assert ts.push([e1]) == ""
    assert ts.text == "caf"
    assert ts.push([e2]) == "é"
    assert ts.push([b]) == "s"
    assert ts.flush() == ""


def test_several_tokens_in_one_push() -> None:
    dec = ByteDecoder()
    ts = TextStream(dec)
    ids = dec.ids([b"a", b"\xe4", b"\xb8", b"\xad", b"b", b"\xf0\x9f"])
    assert ts.push(ids[:2]) == ""  # ends inside 中
    assert ts.push(ids[2:5]) == "a中b"
    assert ts.push(ids[5:]) == ""
    assert ts.push(dec.ids([b"\x98\x80"])) == "😀"
    assert ts.push([]) == ""


def test_flush_sends_a_trailing_partial_character() -> None:
    deltas, tail, _ = stream([b"ab", b"\xe4\xb8"])
    assert deltas == ["ab", ""]
    assert tail == REPLACEMENT
    assert "".join(deltas) + tail == "ab" + REPLACEMENT


def test_an_invalid_byte_is_not_held_forever() -> None:
    deltas, tail, _ = stream([b"a", b"\x80", b"b"])
    assert "".join(deltas) + tail == "a" + REPLACEMENT + "b"


def test_tokens_that_decode_to_nothing() -> None:
    deltas, tail, _ = stream([b"a", b"", b"b", b""])
    assert "".join(deltas) + tail == "ab"


# --- stop strings ----------------------------------------------------------------------------
def test_stop_string_spanning_tokens_is_cut_exactly() -> None:
    deltas, tail, ts = stream(["Hello E", "N", "D wor", "ld"], stop=["END"])
    assert deltas == ["Hello ", "", "", ""]
    assert tail == ""
    assert ts.stopped
    assert ts.text == "Hello "


def test_stop_string_inside_one_token() -> None:
    deltas, tail, ts = stream(["foo", "xSTOPy", "bar"], stop=["STOP"])
    assert deltas == ["foo", "x", ""]
    assert ts.stopped and tail == ""


def test_stop_string_split_into_single_bytes() -> None:
    text = "Hello, 中文 world END and more"
    deltas, tail, ts = stream(single_bytes(text), stop=["END"])
    assert "".join(deltas) + tail == "Hello, 中文 world "
    assert all(REPLACEMENT not in d for d in deltas)
    assert ts.stopped


def test_multibyte_stop_string_split_across_bytes() -> None:
    deltas, tail, ts = stream(single_bytes("abc中文def"), stop=["中文"])
    assert "".join(deltas) + tail == "abc"
    assert ts.stopped


def test_stop_at_the_very_start_sends_nothing() -> None:
    deltas, tail, ts = stream(["ST", "OP", "rest"], stop=["STOP"])
    assert deltas == ["", "", ""] and tail == ""
    assert ts.stopped and ts.text == ""


def test_nothing_is_sent_after_a_stop() -> None:
    dec = ByteDecoder()
    ts = TextStream(dec, ["!"])
    assert ts.push(dec.ids(["hi!"])) == "hi"
    assert ts.push(dec.ids([" more"])) == ""
    assert ts.flush() == ""
    assert ts.text == "hi"


def test_a_held_back_prefix_that_is_not_a_stop_is_released() -> None:
    deltas, tail, ts = stream(["Hello E", "N", "X!"], stop=["END"])
    assert deltas == ["Hello ", "", "ENX!"]
    assert not ts.stopped
    assert tail == ""


def test_a_held_back_prefix_is_released_at_flush() -> None:
    deltas, tail, ts = stream(["Hi E", "N"], stop=["END"])
    assert deltas == ["Hi ", ""]
    assert tail == "EN"
    assert ts.text == "Hi EN" and not ts.stopped


def test_self_overlapping_stop_string() -> None:
    deltas, tail, _ = stream(list("xaaab"), stop=["aab"])
    assert "".join(deltas) + tail == "xa"


@pytest.mark.parametrize("stops", [["world", "lo"], ["lo", "world"]])
def test_with_several_stop_strings_the_earliest_wins(stops: list[str]) -> None:
    deltas, tail, _ = stream(list("hello world"), stop=stops)
    assert "".join(deltas) + tail == "hel"
    deltas, tail, _ = stream(["hello world"], stop=stops)
    assert deltas == ["hel"] and tail == ""


def test_earliest_stop_in_the_same_push_wins_over_a_longer_one() -> None:
    deltas, tail, _ = stream(["say: ", "the end. The END"], stop=["END", "end"])
    assert "".join(deltas) + tail == "say: the "


# --- keeping the stop string (include_stop_str_in_output) --------------------------------------
def test_a_kept_stop_string_spanning_tokens_ends_the_text() -> None:
    deltas, tail, ts = stream(["Hello E", "N", "D wor", "ld"], stop=["END"], include_stop=True)
    assert deltas == ["Hello ", "", "END", ""]  # held back until whole, then sent whole
    assert tail == "" and ts.stopped
    assert ts.text == "Hello END"


def test_text_after_a_kept_stop_string_in_the_same_token_is_dropped() -> None:
    deltas, tail, ts = stream(["foo", "xSTOPy", "bar"], stop=["STOP"], include_stop=True)
    assert deltas == ["foo", "xSTOP", ""]
    assert ts.stopped and tail == "" and ts.text == "fooxSTOP"


def test_a_kept_multibyte_stop_string_split_across_bytes() -> None:
    deltas, tail, ts = stream(single_bytes("abc中文def"), stop=["中文"], include_stop=True)
    assert "".join(deltas) + tail == "abc中文"
    assert all(REPLACEMENT not in d for d in deltas)
    assert ts.stopped


@pytest.mark.parametrize("stops", [["world", "lo"], ["lo", "world"]])
def test_the_earliest_stop_string_is_the_one_kept(stops: list[str]) -> None:
    deltas, tail, _ = stream(["hello world"], stop=stops, include_stop=True)
    assert deltas == ["hello"] and tail == ""


def test_of_two_stop_strings_starting_together_the_first_listed_is_kept() -> None:
    assert stream(["say: the end."], stop=["the", "the end"], include_stop=True)[0] == ["say: the"]
    assert stream(["say: the end."], stop=["the end", "the"], include_stop=True)[0] == [
        "say: the end"
    ]


def test_kept_or_cut_the_text_differs_by_the_stop_string_alone() -> None:
    chunks = single_bytes("one, two; three")
    cut = stream(chunks, stop=["; "])
    kept = stream(chunks, stop=["; "], include_stop=True)
    assert "".join(cut[0]) + cut[1] == "one, two"
    assert "".join(kept[0]) + kept[1] == "one, two; "
    assert not stream(chunks, stop=["four"], include_stop=True)[2].stopped


def test_empty_stop_strings_are_ignored() -> None:
    deltas, tail, ts = stream(["a", "b"], stop=[""])
    assert deltas == ["a", "b"] and tail == "" and not ts.stopped


# --- properties --------------------------------------------------------------------------------
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters=REPLACEMENT))


@st.composite
def split_text(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """A text and its UTF-8 bytes cut at random byte offsets (not only character ones)."""
    text = draw(TEXT)
    raw = text.encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=len(raw))))
    bounds = [0, *[c for c in cuts if c < len(raw)], len(raw)]
    return text, [raw[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@settings(max_examples=300, deadline=None, database=None)
@given(split_text())
def test_deltas_concatenate_to_the_full_decode(case: tuple[str, list[bytes]]) -> None:
    text, chunks = case
    deltas, tail, ts = stream(chunks)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) + tail == text
    assert ts.text == text


def stop_strings(text: str) -> st.SearchStrategy[str]:
    """Stop strings that often occur in ``text`` (a slice of it) and sometimes do not."""
    piece = st.builds(lambda i, n: text[i : i + n], st.integers(0, 40), st.integers(1, 4))
    return st.one_of(TEXT, piece).filter(bool)


@settings(max_examples=150, deadline=None, database=None)
@given(split_text(), st.data())
def test_one_stop_string_cuts_at_its_first_occurrence(
    case: tuple[str, list[bytes]], data: st.DataObject
) -> None:
    text, chunks = case
    stop = data.draw(stop_strings(text))
    deltas, tail, ts = stream(chunks, stop=[stop])
    at = text.find(stop)
    assert "".join(deltas) + tail == (text[:at] if at >= 0 else text)
    assert ts.stopped == (at >= 0)
    assert all(REPLACEMENT not in d for d in deltas)


@settings(max_examples=150, deadline=None, database=None)
@given(split_text(), st.data())
def test_several_stop_strings_cut_before_a_stop_and_never_send_one(
    case: tuple[str, list[bytes]], data: st.DataObject
) -> None:
    # With overlapping stops the cut depends on which one completes first while streaming
    # (generation ends there), so check what must hold whatever the token boundaries.
    text, chunks = case
    stops = data.draw(st.lists(stop_strings(text), min_size=2, max_size=3))
    deltas, tail, ts = stream(chunks, stop=stops)
    out = "".join(deltas) + tail
    found = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    assert ts.stopped == bool(found)
    assert text.startswith(out)
    assert not any(s in out for s in stops)
    if found:
        assert any(text.startswith(s, len(out)) for s in stops)
        _, start_of_first_completed = min(found)
        assert len(out) <= start_of_first_completed
    else:
        assert out == text


@settings(max_examples=150, deadline=None, database=None)
@given(split_text(), st.data())
def test_a_kept_stop_string_ends_the_text_at_its_first_occurrence(
    case: tuple[str, list[bytes]], data: st.DataObject
) -> None:
    text, chunks = case
    stop = data.draw(stop_strings(text))
    deltas, tail, ts = stream(chunks, stop=[stop], include_stop=True)
    at = text.find(stop)
    assert "".join(deltas) + tail == (text[: at + len(stop)] if at >= 0 else text)
    assert ts.stopped == (at >= 0)
    assert all(REPLACEMENT not in d for d in deltas)


# --- the tokenizers library's incremental decoder ------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(model_dir: str) -> Any:
    return AutoTokenizer.from_pretrained(model_dir)


def both(
    tokenizer: Any, ids: list[int], stop: Sequence[str] = (), step: Step | None = None
) -> list[tuple[list[str], str, bool]]:
    """Deltas, flushed tail and whether stopped, of the windowed and the incremental stream."""
    maker = incremental_decoders(tokenizer)
    assert maker is not None
    out = []
    for ts in (TextStream(tokenizer, stop), TextStream(tokenizer, stop, step=step or maker())):
        deltas = [ts.push([t]) for t in ids]
        out.append((deltas, ts.flush(), ts.stopped))
    return out


@settings(max_examples=100, deadline=None, database=None)
@given(st.data())
def test_the_incremental_decoder_streams_the_windowed_decode_text(
    tokenizer: Any, data: st.DataObject
) -> None:
    # Ids of whole words, of single bytes (characters split across ids) and special ids.
    text = data.draw(TEXT)
    ids = tokenizer.encode(text, add_special_tokens=False)
    ids += data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=30))
    ids = data.draw(st.permutations(ids)) if data.draw(st.booleans()) else ids
    stop = data.draw(st.lists(stop_strings(text), max_size=2))
    windowed, incremental = both(tokenizer, ids, stop)
    assert incremental == windowed


def test_a_failing_incremental_decoder_hands_over_to_windows(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello wörld, and ünïcode to follow", add_special_tokens=False)
    maker = incremental_decoders(tokenizer)
    assert maker is not None
    inner, calls = maker(), [0]

    def failing(tid: int) -> str | None:
        calls[0] += 1
        if calls[0] > 4:
            raise ValueError("refused")
        return inner(tid)

    (w_deltas, w_tail, _), (i_deltas, i_tail, _) = both(tokenizer, ids, step=failing)
    assert "".join(i_deltas) + i_tail == "".join(w_deltas) + w_tail
    assert i_deltas[:4] == w_deltas[:4]


def test_a_tokenizer_whose_decode_does_more_gets_no_incremental_decoder(tokenizer: Any) -> None:
    class Shouting:
        backend_tokenizer = tokenizer.backend_tokenizer

        def __len__(self) -> int:
            return len(tokenizer)

        def decode(self, ids: Sequence[int], **kwargs: bool) -> str:
            return str(tokenizer.decode(ids, **kwargs)).upper()

    assert incremental_decoders(tokenizer) is not None
    assert incremental_decoders(Shouting()) is None
    assert incremental_decoders(ByteDecoder()) is None  # no Rust tokenizer behind it
