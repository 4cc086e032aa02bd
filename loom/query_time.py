"""Time phrases in a search's query, as a window over the turns' time.

"what did we decide last week", "the invoices in May", "before the move": a query that
bounds *when* something was said is answered from the turns of that window. English
phrases only; the dates inside them are read by ``dateparser``::

    window("what did we decide last week", now)  # since Monday of last week, until this Monday
    window("the invoices in May", now)           # the last May not after now, the whole month
    window("budget before 3 March 2024", now)    # until 2024-03-03
    window("what changed before the move", now)  # until the time of "the move": an anchor
                                                 # the search resolves (its best hit's time)

A question asking *for* a time ("when did ...") bounds nothing: it gets no window
(``asks_when`` says so). Relative phrases read from ``now`` (the server's clock). The
phrase's words stay in the query: they still rank (a turn saying "last week" is often
the one meant).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
_MONTH = "|".join(sorted((m for m in MONTHS if len(m) > 3 or m == "may"), key=len, reverse=True))
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "ten": 10}

_RELATIVE = re.compile(r"\b(yesterday|today|this (?:week|month|year)|last (?:week|month|year))\b", re.I)
_AGO = re.compile(
    r"\b(?:in the (?:last|past) )(\d+|a|an|one|two|three|four|five|six|ten) (day|week|month|year)s?\b", re.I
)
_IN_MONTH = re.compile(rf"\b(?:in|during) ({_MONTH})(?: (\d{{4}}))?\b", re.I)
_IN_YEAR = re.compile(r"\b(?:in|during) ((?:19|20)\d{2})\b", re.I)
# before/after/since + something dateparser can read ("3 March 2024", "May 2023", "2024-03-03")
_BOUND = re.compile(
    rf"\b(before|after|since|until) ((?:\d{{1,2}} )?(?:{_MONTH})(?: \d{{1,2}})?(?:,? \d{{4}})?|\d{{4}}-\d{{2}}-\d{{2}}|(?:19|20)\d{{2}})\b",
    re.I,
)
# before/after + an event ("before the move", "after my surgery"): resolved by a search
_ANCHOR = re.compile(
    r"\b(before|after|since) ((?:the|my|our|his|her|their|your) [a-z][\w'-]*(?: [a-z][\w'-]*)?)", re.I
)
_WHEN = re.compile(r"^\s*(?:when|what (?:date|day|month|year|time))\b", re.I)


@dataclass(frozen=True)
class TimeWindow:
    """``since <= ts < until`` (either open); ``phrase``: the words that set it;
    ``anchor``: event words whose time bounds the window (``before``: until it,
    ``after``/``since``: from it), for the caller to resolve."""

    since: datetime | None = None
    until: datetime | None = None
    phrase: str = ""
    anchor: str = ""
    anchor_side: str = ""  # "before" or "after"


def asks_when(query: str) -> bool:
    """Does the question ask for a time ("when did ...")? It bounds none."""
    return bool(_WHEN.match(query))


def _day(dt: datetime) -> datetime:
    return dt.replace(hour=0, minute=0, second=0, microsecond=0)


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1, tzinfo=UTC)


def _next_month(dt: datetime) -> datetime:
    return _month_start(dt.year + dt.month // 12, dt.month % 12 + 1)


def _relative(word: str, now: datetime) -> tuple[datetime, datetime]:
    today = _day(now)
    week = today - timedelta(days=today.weekday())
    month = _month_start(now.year, now.month)
    year = datetime(now.year, 1, 1, tzinfo=UTC)
    spans = {
        "today": (today, today + timedelta(days=1)),
        "yesterday": (today - timedelta(days=1), today),
        "this week": (week, week + timedelta(days=7)),
        "last week": (week - timedelta(days=7), week),
        "this month": (month, _next_month(month)),
        "last month": (_month_start(now.year - (now.month == 1), (now.month - 2) % 12 + 1), month),
        "this year": (year, year.replace(year=now.year + 1)),
        "last year": (year.replace(year=now.year - 1), year),
    }
    return spans[" ".join(word.lower().split())]


def _parse_date(text: str, now: datetime) -> datetime | None:
    import dateparser

    found = dateparser.parse(
        text,
        languages=["en"],
        settings={
            "RELATIVE_BASE": now.replace(tzinfo=None),
            "PREFER_DATES_FROM": "past",
            "PREFER_DAY_OF_MONTH": "first",
            "RETURN_AS_TIMEZONE_AWARE": False,
        },
    )
    return None if found is None else found.replace(tzinfo=UTC)


def window(query: str, now: datetime) -> TimeWindow | None:
    """The time window the query's words set, or None. The first phrase found wins, in
    this order: a bound with a date, an explicit period, a relative period, an anchor."""
    now = now.astimezone(UTC)
    if m := _BOUND.search(query):
        side, text = m.group(1).lower(), m.group(2)
        at = _parse_date(text, now)
        if at is not None:
            if re.fullmatch(r"(?:19|20)\d{2}", text):
                at = datetime(int(text) + (side in ("after",)), 1, 1, tzinfo=UTC)
            elif not re.search(r"\d{1,2}(?!\d)", text.split(",")[0]) or re.fullmatch(
                rf"(?:{_MONTH})(?: \d{{4}})?", text, re.I
            ):
                # a month: "before May" ends where May starts, "after May" starts where it ends
                at = _month_start(at.year, at.month)
                if side == "after":
                    at = _next_month(at)
            elif side == "after":
                at = _day(at) + timedelta(days=1)
            return (
                TimeWindow(since=at, phrase=m.group(0))
                if side in ("after", "since")
                else TimeWindow(until=at, phrase=m.group(0))
            )
    if m := next((m for m in _IN_MONTH.finditer(query) if m.group(1) != "may"), None):  # "in may be": a verb
        month = MONTHS[m.group(1).lower()]
        year = int(m.group(2)) if m.group(2) else (now.year if month <= now.month else now.year - 1)
        start = _month_start(year, month)
        return TimeWindow(since=start, until=_next_month(start), phrase=m.group(0))
    if m := _IN_YEAR.search(query):
        year = int(m.group(1))
        return TimeWindow(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC), m.group(0))
    if m := _AGO.search(query):
        n = _NUMBER_WORDS.get(m.group(1).lower()) or int(m.group(1))
        return TimeWindow(since=now - timedelta(days=n * UNITS[m.group(2).lower()]), phrase=m.group(0))
    if m := _RELATIVE.search(query):
        since, until = _relative(m.group(1), now)
        return TimeWindow(since, until, m.group(0))
    if m := _ANCHOR.search(query):
        side = "before" if m.group(1).lower() == "before" else "after"
        return TimeWindow(phrase=m.group(0), anchor=m.group(2), anchor_side=side)
    return None
