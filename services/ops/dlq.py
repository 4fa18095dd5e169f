"""``tokenwire dlq``: read, re-drive and trim the dead-letter topic.

A dead letter is named by where it lies on the dead-letter topic, ``PARTITION:OFFSET``:
unique and stable, where a request id is not (a request that fails, is replayed and fails
again has two dead letters). ``show`` and ``replay`` also take a request id, meaning that
request's newest dead letter.

Replay re-publishes the original request bytes (checked against their SHA-256; a letter
holding only a truncated copy cannot be replayed) to the requests topic (a backend
service's own, for a request read from it: the batcher checks its tenant again), with the
replay count in the record's ``tw-replay`` header. One Redis script per request decides and
prepares each replay as one step, so racing replays cannot both pass it:

- a request whose stream ended with an answer is not sent again (``answered``);
- one with a live claim or a stream in progress is being served (``running``);
- one with a done marker and no stream left to show how it ended is not sent (``done``);
- one replayed ``max_replays`` times already is not sent again (``limit``): a message
  that failed again after its replay stays dead;
- otherwise its failed stream and done marker are removed (so the pipeline serves it
  afresh: the worker's claim script refuses a request with a done marker) and its replay
  counter (``<prefix>:dlq:replays:<request id>``, kept 7 days) goes up.

Past the script, the pipeline itself never generates a request twice: a worker takes a
request's claim before it runs it and finishes it with a done marker.

Kafka cannot delete single records: ``purge --before TIME`` deletes, per partition, every
record before the first one written at or after TIME (the admin client's DeleteRecords,
which moves the partition's start offset)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import RecordsToDelete

from shared.codec import DecodeError, decode
from shared.kafka_io import make_admin, make_consumer, make_producer
from shared.messages import DeadLetter, GenerateRequest
from shared.names import Names
from shared.settings import CommonSettings

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

REPLAY_HEADER = "tw-replay"
REPLAYS_TTL_S = 7 * 24 * 3600
DEFAULT_MAX_REPLAYS = 1


@dataclass(frozen=True, slots=True)
class Letter:
    """One record of the dead-letter topic: where it lies, when it was written, and the
    dead letter it holds (None for a record that is not one)."""

    partition: int
    offset: int
    timestamp_ms: int
    letter: DeadLetter | None

    @property
    def id(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def reason(self) -> str:
        return self.letter.reason if self.letter else "unreadable_dead_letter"

    @property
    def request_id(self) -> str | None:
        return self.letter.request_id if self.letter else None


def replays_key(names: Names, request_id: str) -> str:
    """Counter of the times a request was replayed from the dead-letter topic."""
    return f"{names.prefix}:dlq:replays:{{{request_id}}}"  # the request's slot


# --- pure parts ----------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: float) -> float:
    """Unix seconds of ``text``: a duration back from ``now`` (``90s``, ``15m``, ``2h``,
    ``7d``) or an ISO 8601 time (UTC when it names no zone)."""
    m = _DURATION.match(text.strip())
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r}: not a duration (30s, 15m, 2h, 7d) or an ISO time") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()


def service_of(letter: DeadLetter, names: Names) -> str:
    """Which service wrote a dead letter, from the topic its message was read from."""
    if letter.topic.startswith(names.requests_from("")):  # a backend service's own topic
        return "batcher"
    return {names.requests: "batcher", names.batches: "worker"}.get(letter.topic, "unknown")


def replay_topic(letter: DeadLetter, names: Names) -> str:
    """Where a replayed request goes: back to a backend service's own requests topic (so
    the batcher checks again which tenants it may speak for), else the shared one."""
    return letter.topic if letter.topic.startswith(names.requests_from("")) else names.requests


def original_bytes(letter: DeadLetter) -> bytes:
    return base64.b64decode(letter.original_b64)


def decoded_original(letter: DeadLetter) -> Any:
    """The original message: parsed JSON where it is JSON, else text, else None."""
    raw = original_bytes(letter)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def replayable(letter: DeadLetter) -> str | None:
    """Why a dead letter's original cannot be sent again, or None when it can."""
    raw = original_bytes(letter)
    if letter.truncated:
        return f"only the first {len(raw)} of {letter.original_size} bytes were kept"
    if letter.original_sha256 and hashlib.sha256(raw).hexdigest() != letter.original_sha256:
        return "the copy does not match the original's SHA-256"
    try:
        req = decode(GenerateRequest, raw)
    except DecodeError as exc:
        return f"the original is not a request ({exc.reason}): fix it at its source"
    if letter.request_id and req.request_id != letter.request_id:
        return "the copy's request id is not the dead letter's"
    return None


def select(
    letters: Iterable[Letter],
    *,
    since: float | None = None,
    reason: str | None = None,
    limit: int | None = None,
) -> list[Letter]:
    """The letters written at or after ``since`` with ``reason``; the newest ``limit``."""
    out = [
        x
        for x in letters
        if (since is None or x.timestamp_ms >= since * 1000)
        and (reason is None or x.reason == reason)
    ]
    out.sort(key=lambda x: (x.timestamp_ms, x.partition, x.offset))
    return out[-limit:] if limit else out


def resolve(letters: Sequence[Letter], ident: str) -> Letter | None:
    """The letter ``PARTITION:OFFSET`` names, or the newest one of request id ``ident``."""
    m = re.fullmatch(r"(\d+):(\d+)", ident)
    if m:
        p, o = int(m.group(1)), int(m.group(2))
        return next((x for x in letters if (x.partition, x.offset) == (p, o)), None)
    mine = [x for x in letters if x.request_id == ident]
    return max(mine, key=lambda x: x.timestamp_ms) if mine else None


def newest_per_request(letters: Iterable[Letter]) -> list[Letter]:
    """One letter per request id (its newest); letters without one stay as they are."""
    newest: dict[str, Letter] = {}
    loose: list[Letter] = []
    for x in letters:
        rid = x.request_id
        if rid is None:
            loose.append(x)
        elif rid not in newest or x.timestamp_ms >= newest[rid].timestamp_ms:
            newest[rid] = x
    return [*newest.values(), *loose]


def summary(x: Letter, names: Names) -> dict[str, Any]:
    """A letter as ``list --json`` prints it."""
    d = x.letter
    return {
        "id": x.id,
        "at": x.timestamp_ms / 1000,
        "reason": x.reason,
        "request_id": x.request_id,
        "service": service_of(d, names) if d else None,
        "detail": d.detail if d else "",
        "from": {"topic": d.topic, "partition": d.partition, "offset": d.offset} if d else None,
        "size": d.original_size if d else None,
    }


# --- Kafka and Redis -----------------------------------------------------------------------


async def read_letters(settings: CommonSettings, since: float | None = None) -> list[Letter]:
    """Every record of the dead-letter topic now there (from ``since`` on, when given)."""
    topic = settings.names.requests_dlq
    consumer = make_consumer(settings, group_id=None, client_id="tw-dlq")
    try:
        await consumer.start()
        parts = [TopicPartition(topic, p) for p in sorted(await partitions_of(consumer, topic))]
        if not parts:
            return []
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        starts = await consumer.beginning_offsets(parts)
        if since is not None:
            found = await consumer.offsets_for_times({tp: int(since * 1000) for tp in parts})
            starts = {tp: (found[tp].offset if found[tp] else ends[tp]) for tp in parts}
        for tp in parts:
            consumer.seek(tp, starts[tp])
        out: list[Letter] = []
        todo = {tp for tp in parts if starts[tp] < ends[tp]}
        while todo:
            got = await consumer.getmany(*todo, timeout_ms=1000)
            for tp, msgs in got.items():
                for m in msgs:
                    if m.offset < ends[tp]:
                        out.append(Letter(m.partition, m.offset, m.timestamp, _letter(m.value)))
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
        return out
    finally:
        await consumer.stop()


async def partitions_of(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The partitions of ``topic`` (empty when it does not exist), metadata fetched."""
    for _ in range(20):
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return set(parts)
        await consumer._client.force_metadata_update()  # no public refresh
        await asyncio.sleep(0.1)
    return set()


def _letter(value: bytes | None) -> DeadLetter | None:
    try:
        return decode(DeadLetter, value or b"")
    except DecodeError:
        return None


# KEYS: done marker, claim, replay log, replay counter.
# ARGV: max replays, counter TTL (s), '1' to only look.
# Returns {verdict, replays so far (after this one when it is 'ok')}.
_GATE = """
local n = tonumber(redis.call('GET', KEYS[4]) or '0')
if redis.call('EXISTS', KEYS[2]) == 1 then return {'running', n} end
local failed = false
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
if last[1] then
  local fields = last[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'd' then
      local ok, ev = pcall(cjson.decode, fields[i + 1])
      if ok and type(ev) == 'table' then
        local fin = ev['finish_reason']
        if fin == nil or fin == cjson.null then return {'running', n} end
        if fin ~= 'error' then return {'answered', n} end
        failed = true
      end
    end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 and not failed then return {'done', n} end
if n >= tonumber(ARGV[1]) then return {'limit', n} end
if ARGV[3] == '1' then return {'ok', n + 1} end
redis.call('DEL', KEYS[1], KEYS[3])
n = redis.call('INCR', KEYS[4])
redis.call('EXPIRE', KEYS[4], ARGV[2])
return {'ok', n}
"""

VERDICTS = {
    "ok": "replayed",
    "running": "not replayed: it is being served now",
    "answered": "not replayed: it was answered already",
    "done": "not replayed: it is marked done and its stream is gone, so how it ended is unknown",
    "limit": "not replayed: replay limit reached",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    letter: Letter
    verdict: str  # a key of VERDICTS, or 'refused' with why
    replays: int = 0
    why: str = ""

    def line(self, max_replays: int, dry_run: bool) -> str:
        rid = self.letter.request_id or "-"
        if self.verdict == "refused":
            text = f"not replayed: {self.why}"
        elif self.verdict == "ok":
            text = "would be replayed" if dry_run else "replayed"
            text += f" (replay {self.replays} of at most {max_replays})"
        elif self.verdict == "limit":
            text = f"{VERDICTS['limit']} ({self.replays} of {max_replays}): it stays dead"
        else:
            text = VERDICTS[self.verdict]
        return f"{self.letter.id}  {rid}  {text}"


async def replay(
    settings: CommonSettings,
    letters: Sequence[Letter],
    *,
    max_replays: int = DEFAULT_MAX_REPLAYS,
    dry_run: bool = False,
) -> list[Outcome]:
    """Re-publish each letter's original request, as the module docstring says."""
    names = settings.names
    client = aioredis.Redis.from_url(settings.redis_url)
    producer = None if dry_run else make_producer(settings, client_id="tw-dlq-replay")
    out: list[Outcome] = []
    try:
        if producer is not None:
            await producer.start()
        for x in letters:
            why = replayable(x.letter) if x.letter else "the record is not a dead letter"
            if why is not None or x.letter is None:
                out.append(Outcome(x, "refused", why=why or ""))
                continue
            raw = original_bytes(x.letter)
            rid = decode(GenerateRequest, raw).request_id
            keys = [names.done_marker(rid), names.claim(rid), names.token_log(rid)]
            keys.append(replays_key(names, rid))
            args = [max_replays, REPLAYS_TTL_S, "1" if dry_run else "0"]
            verdict, n = await client.eval(_GATE, len(keys), *keys, *args)
            verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
            if verdict == "ok" and producer is not None:
                try:
                    await producer.send_and_wait(
                        replay_topic(x.letter, names),
                        raw,
                        key=rid.encode(),
                        headers=[(REPLAY_HEADER, str(n).encode())],
                    )
                except BaseException:
                    await client.decr(replays_key(names, rid))  # not sent: not counted
                    raise
            out.append(Outcome(x, verdict, int(n)))
    finally:
        if producer is not None:
            await producer.stop()
        await client.aclose()
    return out


async def purge(settings: CommonSettings, before: float) -> dict[int, tuple[int, int]]:
    """Delete every dead letter written before ``before``, per partition: returns the
    partition's (records deleted, new start offset)."""
    topic = settings.names.requests_dlq
    consumer = make_consumer(settings, group_id=None, client_id="tw-dlq")
    try:
        await consumer.start()
        parts = [TopicPartition(topic, p) for p in sorted(await partitions_of(consumer, topic))]
        if not parts:
            return {}
        starts = await consumer.beginning_offsets(parts)
        ends = await consumer.end_offsets(parts)
        found = await consumer.offsets_for_times({tp: int(before * 1000) for tp in parts})
    finally:
        await consumer.stop()
    cut = {tp: (found[tp].offset if found[tp] else ends[tp]) for tp in parts}
    todo = {tp: RecordsToDelete(cut[tp]) for tp in parts if cut[tp] > starts[tp]}
    if todo:
        admin = make_admin(settings, client_id="tw-dlq")
        try:
            await admin.start()
            await admin.delete_records(todo)
        finally:
            await admin.close()
    return {tp.partition: (max(0, cut[tp] - starts[tp]), max(cut[tp], starts[tp])) for tp in parts}


# --- the command ---------------------------------------------------------------------------


def _fmt_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def cmd_list(args: argparse.Namespace) -> None:
    settings = CommonSettings.from_env()
    since = parse_time(args.since, time.time()) if args.since else None
    letters = select(
        asyncio.run(read_letters(settings, since)), reason=args.reason, limit=args.limit
    )
    if args.json:
        print(json.dumps([summary(x, settings.names) for x in letters], indent=1))
        return
    print(f"{'ID':<10} {'WRITTEN (UTC)':<19}  {'REASON':<24} {'SERVICE':<8} REQUEST ID")
    for x in letters:
        svc = service_of(x.letter, settings.names) if x.letter else "-"
        written = _fmt_time(x.timestamp_ms)
        print(f"{x.id:<10} {written:<19}  {x.reason:<24} {svc:<8} {x.request_id or '-'}")
    print(f"{len(letters)} dead letter(s) on {settings.names.requests_dlq}")


def cmd_show(args: argparse.Namespace) -> None:
    settings = CommonSettings.from_env()
    x = resolve(asyncio.run(read_letters(settings)), args.id)
    if x is None:
        sys.exit(f"no dead letter {args.id!r} on {settings.names.requests_dlq}")
    d = x.letter
    shown: dict[str, Any] = {
        "id": x.id,
        "dead_letter": {
            "topic": settings.names.requests_dlq,
            "partition": x.partition,
            "offset": x.offset,
            "written": _fmt_time(x.timestamp_ms),
        },
    }
    if d is None:
        shown["reason"] = x.reason
    else:
        shown |= {
            "reason": d.reason,
            "detail": d.detail,
            "service": service_of(d, settings.names),
            "request_id": d.request_id,
            "original": {
                "topic": d.topic,
                "partition": d.partition,
                "offset": d.offset,
                "key": d.key,
                "size": d.original_size,
                "sha256": d.original_sha256,
                "truncated": d.truncated,
                "decoded": decoded_original(d),
            },
            "replayable": replayable(d) or "yes",
        }
        if shown["original"]["decoded"] is None:  # neither JSON nor text: the bytes as kept
            shown["original"]["base64"] = d.original_b64
    print(json.dumps(shown, indent=2, ensure_ascii=False))


def cmd_replay(args: argparse.Namespace) -> None:
    settings = CommonSettings.from_env()
    letters = asyncio.run(read_letters(settings))
    chosen: list[Letter] = []
    if args.reason:
        chosen = newest_per_request(select(letters, reason=args.reason))
    for ident in args.ids:
        found = resolve(letters, ident)
        if found is None:
            sys.exit(f"no dead letter {ident!r} on {settings.names.requests_dlq}")
        chosen.append(found)
    outcomes = asyncio.run(
        replay(settings, chosen, max_replays=args.max_replays, dry_run=args.dry_run)
    )
    for o in outcomes:
        print(o.line(args.max_replays, args.dry_run))
    sent = sum(o.verdict == "ok" for o in outcomes)
    verb = "would be replayed" if args.dry_run else "replayed"
    print(f"{sent} of {len(outcomes)} {verb} to {settings.names.requests}")


def cmd_purge(args: argparse.Namespace) -> None:
    settings = CommonSettings.from_env()
    before = parse_time(args.before, time.time())
    done = asyncio.run(purge(settings, before))
    for p, (n, start) in sorted(done.items()):
        print(f"partition {p}: {n} record(s) deleted, it now starts at offset {start}")
    total = sum(n for n, _ in done.values())
    print(f"{total} dead letter(s) written before {_fmt_time(int(before * 1000))} UTC deleted")


def add_parser(sub: Subparsers) -> None:
    d = sub.add_parser("dlq", help="inspect, replay and purge dead letters")
    dsub = d.add_subparsers(dest="dlq", required=True)
    ls = dsub.add_parser("list", help="the dead letters, oldest first")
    ls.add_argument("--since", help="only those written since: a duration (15m, 2h) or ISO time")
    ls.add_argument("--reason", help="only those with this reason")
    ls.add_argument("--limit", type=int, help="only the newest N")
    ls.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    ls.set_defaults(fn=cmd_list)
    sh = dsub.add_parser(
        "show", help="one dead letter: reason, where it came from, the original decoded"
    )
    sh.add_argument("id", help="PARTITION:OFFSET on the dead-letter topic, or a request id")
    sh.set_defaults(fn=cmd_show)
    rp = dsub.add_parser(
        "replay", help="send the original requests again (never one answered or running)"
    )
    rp.add_argument("ids", nargs="*", help="PARTITION:OFFSET or request ids")
    rp.add_argument("--reason", help="every request whose newest dead letter has this reason")
    rp.add_argument(
        "--max-replays",
        type=int,
        default=DEFAULT_MAX_REPLAYS,
        help="replays a request may have; one that failed after them stays dead (default 1)",
    )
    rp.add_argument("--dry-run", action="store_true", help="say what would be sent, send nothing")
    rp.set_defaults(fn=_checked_replay(rp))
    pg = dsub.add_parser(
        "purge",
        help="delete the dead letters written before TIME (Kafka DeleteRecords: per "
        "partition, everything before the first record at or after TIME)",
    )
    pg.add_argument("--before", required=True, help="a duration back from now (7d) or ISO time")
    pg.set_defaults(fn=cmd_purge)


def _checked_replay(parser: argparse.ArgumentParser) -> Any:
    def run(args: argparse.Namespace) -> None:
        if not args.ids and not args.reason:
            parser.error("name dead letters (PARTITION:OFFSET or request ids) or --reason")
        cmd_replay(args)

    return run
