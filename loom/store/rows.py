"""Rows by name: each table's columns declared once, on its row dataclass.

A row dataclass (:func:`table_row`, or :func:`frozen_table_row` for a row nothing
changes once built) declares every column it carries with :func:`column` (its ClickHouse
type beside the field); a :class:`Table` adds the columns only the writer fills (the
``version`` a store module stamps) and derives from that one declaration what used to be
kept by hand in several places: the insert's column names and types, the read's column
list and the decoder that turns a result row into the dataclass by name. The
schema-drift test compares every :data:`TABLES` entry with the live schema after all
migrations, so a column added in SQL but not here (or the reverse, or a changed type)
fails the suite.

Reads of a few columns that are no table's row (aggregates, joins, key lookups) name
their columns with ``AS`` aliases and read them with :func:`named`; a single value is
read with :func:`scalar`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Generic, TypeVar, dataclass_transform

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.insert import InsertContext
from clickhouse_connect.driver.query import QueryResult

T = TypeVar("T")
R = TypeVar("R")

_TYPE = "clickhouse_type"
_WRITE = "clickhouse_write"
_ENCODE = "clickhouse_encode"
_DECODE = "clickhouse_decode"


def column(
    ch_type: str,
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    write: bool = True,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field that is a column of type `ch_type`. ``write=False``: the server
    fills it (a DEFAULT), inserts leave it out. `encode`/`decode` convert between the
    field's Python value and the column's (JSON text, for instance)."""
    metadata = {_TYPE: ch_type, _WRITE: write, _ENCODE: encode, _DECODE: decode}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# The row decorators are dataclasses that type checkers are told take `column` as a field
# specifier, so a column without a default is a required argument to them (a plain
# dataclass reads ``= column(...)`` as a default: a row built without a column passed).
@dataclass_transform(field_specifiers=(column,))
def table_row(cls: type[T]) -> type[T]:
    """A table's row: a dataclass whose fields are the table's columns."""
    return dataclass(cls)


@dataclass_transform(frozen_default=True, field_specifiers=(column,))
def frozen_table_row(cls: type[T]) -> type[T]:
    """A table's row that is never changed once built (a frozen dataclass)."""
    return dataclass(frozen=True)(cls)


def json_text(value: Any) -> str:
    """A JSON column's text: compact (no spaces), as every writer stored it."""
    return json.dumps(value, separators=(",", ":"))


def json_object(raw: str) -> dict[str, Any]:
    """A JSON-object column's value; {} for an empty, malformed or non-object text (a
    read never fails on a row a client wrote)."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Column:
    name: str
    type: str


# The column of a table whose writer stamps each row's version (an insert's ``version=``).
VERSION = Column("version", "UInt64")
# The column the server fills with the time a row landed (a DEFAULT no insert names).
INSERTED_AT = Column("created_at", "DateTime64(3, 'UTC')")


def _columns_of(row: type) -> list[Field[Any]]:
    return [f for f in fields(row) if _TYPE in f.metadata]


def _read_expr(name: str, ch_type: str) -> str:
    # LowCardinality columns are read as plain strings (what every read did before the
    # declaration; the dictionary-encoded form costs the client more to decode).
    return f"toString({name})" if ch_type.startswith("LowCardinality(") else name


def _bool(value: Any) -> bool:
    return bool(value)


def _int(value: Any) -> int:
    return int(value)


def _list(value: Any) -> list[Any]:
    return list(value)


_DEFAULT_DECODERS: dict[str, Callable[[Any], Any]] = {
    "Bool": _bool,
    "UInt32": _int,
    "UInt64": _int,
    "Array(String)": _list,
}


class Table(Generic[T]):
    """One table: its name, its row dataclass, the columns only the writer adds (`extra`,
    given to :meth:`values` by name) and those only the server fills (`server`: a DEFAULT
    no insert names and no row carries, such as ``created_at``)."""

    def __init__(
        self, name: str, row: type[T], *, extra: Sequence[Column] = (), server: Sequence[Column] = ()
    ) -> None:
        self.name = name
        self.row = row
        self._fields = _columns_of(row)
        self.extra = tuple(extra)
        self.columns = tuple(
            [Column(f.name, f.metadata[_TYPE]) for f in self._fields] + list(self.extra) + list(server)
        )
        written = [f for f in self._fields if f.metadata[_WRITE]]
        self._encoders = [(f.name, f.metadata[_ENCODE]) for f in written]
        self.insert_names = [f.name for f in written] + [c.name for c in self.extra]
        self.insert_types = [f.metadata[_TYPE] for f in written] + [c.type for c in self.extra]
        # The read: every declared field, in declaration order, decoded by name.
        self.read_names = [f.name for f in self._fields]
        self.read_list = ", ".join(_read_expr(f.name, f.metadata[_TYPE]) for f in self._fields)
        found = [
            (f.name, f.metadata[_DECODE] or _DEFAULT_DECODERS.get(f.metadata[_TYPE])) for f in self._fields
        ]
        self._decoders: list[tuple[str, Callable[[Any], Any]]] = [(n, d) for n, d in found if d is not None]

    def values(self, row: T, **extra: Any) -> list[Any]:
        """The insert values of `row` in :attr:`insert_names` order (`extra`: the writer's columns)."""
        out = [getattr(row, name) if enc is None else enc(getattr(row, name)) for name, enc in self._encoders]
        return out + [extra[c.name] for c in self.extra]

    def insert(
        self, ch: Client, rows: Sequence[T], *, settings: Mapping[str, Any] | None = None, **extra: Any
    ) -> None:
        """One INSERT of `rows`, with the declared types (no DESCRIBE round trip)."""
        context = ch.create_insert_context(
            self.name,
            column_names=self.insert_names,
            column_type_names=self.insert_types,
            settings=dict(settings) if settings else None,
        )
        try:
            ch.insert(data=[self.values(r, **extra) for r in rows], context=context)
        finally:
            _let_go(context)

    def insert_columns(
        self, ch: Client, columns: Mapping[str, Sequence[Any]], *, settings: Mapping[str, Any] | None = None
    ) -> None:
        """One INSERT of rows given column by column, by name (every insert column, each
        already encoded): for many small rows built in bulk, no dataclass per row."""
        if set(columns) != set(self.insert_names):
            raise ValueError(f"{self.name}: columns {sorted(columns)} are not {sorted(self.insert_names)}")
        context = ch.create_insert_context(
            self.name,
            column_names=self.insert_names,
            column_type_names=self.insert_types,
            column_oriented=True,
            settings=dict(settings) if settings else None,
        )
        try:
            ch.insert(data=[columns[name] for name in self.insert_names], context=context)
        finally:
            _let_go(context)

    def decode(self, values: Sequence[Any]) -> T:
        """A row read with :attr:`read_list`, as the dataclass (by field name)."""
        data = dict(zip(self.read_names, values, strict=True))
        for name, dec in self._decoders:
            data[name] = dec(data[name])
        return self.row(**data)

    def first(self, ch: Client, where_sql: str, parameters: Mapping[str, Any]) -> T | None:
        """The first row :meth:`select` returns, or None."""
        return next(iter(self.select(ch, where_sql, parameters)), None)

    def rows(self, result: QueryResult) -> list[T]:
        """Every row of a query that selected :attr:`read_list`, decoded."""
        return [self.decode(r) for r in result.result_rows]

    def rows_with(self, result: QueryResult) -> list[tuple[T, dict[str, Any]]]:
        """A query that selected :attr:`read_list` then columns of its own (a score, a
        rank): each row decoded, with its own columns by name."""
        n = len(self.read_names)
        own = result.column_names[n:]
        return [(self.decode(r[:n]), dict(zip(own, r[n:], strict=True))) for r in result.result_rows]

    def revise(
        self, ch: Client, replaced: Mapping[str, str], where_sql: str, parameters: Mapping[str, Any]
    ) -> None:
        """A new version (``{v:UInt64}`` of `parameters`) of the newest version of every row
        `where_sql` selects, written by the engine in one statement (no row to the client):
        each column copied, or the SQL expression `replaced` gives for it."""
        names = [n for n in self.insert_names if n != "version"]
        exprs = [replaced.get(n, n) for n in names]
        ch.command(
            f"INSERT INTO {self.name} ({', '.join([*names, 'version'])}) "
            f"SELECT {', '.join(exprs)}, {{v:UInt64}} FROM {self.name} FINAL WHERE {where_sql}",
            parameters=dict(parameters),
        )

    def reader(self, row: type[R], **decoders: Callable[[Any], Any]) -> Reader[R]:
        """A read of the columns `row` names (its fields) into `row`."""
        return Reader(self, row, decoders)

    def select(
        self, ch: Client, where_sql: str, parameters: Mapping[str, Any], *, final: bool = True
    ) -> list[T]:
        """``SELECT <every declared field> FROM <table> [FINAL] <where_sql>``, decoded."""
        sql = f"SELECT {self.read_list} FROM {self.name}{' FINAL' if final else ''} {where_sql}"
        return self.rows(ch.query(sql, parameters=dict(parameters)))


class Reader(Generic[R]):
    """A read of some of a table's columns into another dataclass whose field names are
    those columns' names: its column list and decoder derive from the table's declaration."""

    def __init__(self, table: Table[Any], row: type[R], decoders: Mapping[str, Callable[[Any], Any]]) -> None:
        types = {c.name: c.type for c in table.columns}
        names = [f.name for f in fields(row)]  # type: ignore[arg-type]  # R is a dataclass; typing has no bound for one
        unknown = [n for n in names if n not in types]
        if unknown:
            raise TypeError(f"{row.__name__} names no column of {table.name}: {unknown}")
        self.row = row
        self.read_names = names
        self.read_list = ", ".join(_read_expr(n, types[n]) for n in names)
        found = [(n, decoders.get(n) or _DEFAULT_DECODERS.get(types[n])) for n in names]
        self._decoders: list[tuple[str, Callable[[Any], Any]]] = [(n, d) for n, d in found if d is not None]

    def decode(self, values: Sequence[Any]) -> R:
        data = dict(zip(self.read_names, values, strict=True))
        for name, dec in self._decoders:
            data[name] = dec(data[name])
        return self.row(**data)

    def rows(self, result: QueryResult) -> list[R]:
        """Every row of a query that selected :attr:`read_list`, decoded."""
        return [self.decode(r) for r in result.result_rows]


# Every table whose rows Loom writes from a declared row (the schema-drift test's list).
TABLES: dict[str, Table[Any]] = {}


def table(
    name: str, row: type[T], *, extra: Sequence[Column] = (), server: Sequence[Column] = ()
) -> Table[T]:
    """Declare (and register) the table `name` with row dataclass `row`."""
    spec = Table(name, row, extra=extra, server=server)
    TABLES[name] = spec
    return spec


def named(result: QueryResult) -> Iterator[dict[str, Any]]:
    """The rows of a query result as dicts keyed by column name (use ``AS`` aliases)."""
    names = result.column_names
    for values in result.result_rows:
        yield dict(zip(names, values, strict=True))


# What a by-name decode converts a value to by its field's annotation: a flag or a count
# computed by the query (``length(x) > 0``, ``count()``) arrives as another integer type.
_COERCE: dict[str, Callable[[Any], Any]] = {"bool": bool, "int": int, "float": float}


# The aliases reads give the key columns they read as strings (``toString(namespace) AS
# ns``): an alias that shadows a column would stand for it in the WHERE too.
KEY_ALIASES = {"namespace": "ns", "agent": "ag", "role": "role_name"}


_Plan = tuple[tuple[str, bool, Callable[[Any], Any] | None], ...]
_PLANS: dict[type[Any], _Plan] = {}


def _coercions(row: type[Any]) -> _Plan:
    """Per field of `row`: its name, whether it has a default, its conversion (computed
    once per dataclass)."""
    plan = _PLANS.get(row)
    if plan is None:
        # An annotation is its text under ``from __future__ import annotations``, else the type.
        plan = _PLANS[row] = tuple(
            (
                f.name,
                f.default is not MISSING or f.default_factory is not MISSING,
                _COERCE.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")),
            )
            for f in fields(row)
        )
    return plan


def decoded(
    row: type[R], values: Mapping[str, Any], columns: Mapping[str, str] | None = None, **given: Any
) -> R:
    """`values` (one row of :func:`named`) as the dataclass `row`, by name: each field from
    the column of its name, or of the alias `columns` maps it to (a read that keeps its
    aliases apart from the columns it filters on), a ``bool``/``int``/``float`` field
    converted, a field with a default that the read leaves out left to it; `given`: fields
    that are no column (a nested key, a value computed here)."""
    aliases = columns or {}
    data = dict(given)
    for name, optional, coerce in _coercions(row):
        column_name = aliases.get(name, name)
        if name in data or (optional and column_name not in values):
            continue
        value = values[column_name]
        data[name] = coerce(value) if coerce is not None else value
    return row(**data)


def named_columns(result: QueryResult) -> dict[str, list[Any]]:
    """A query result column by column, keyed by column name (use ``AS`` aliases): for
    reads of many rows that are used as columns (arrays), not as rows."""
    if not result.result_rows:
        return {name: [] for name in result.column_names}
    return {name: list(col) for name, col in zip(result.column_names, result.result_columns, strict=True)}


def scalar(ch: Client, sql: str, parameters: Mapping[str, Any] | None = None) -> Any:
    """The single value a query returns (a count, a sum, a clock reading); None when it
    returns no row."""
    result = ch.query(sql, parameters=dict(parameters) if parameters else None)
    first = result.first_item
    return first[result.column_names[0]] if first else None


def _let_go(context: InsertContext) -> None:
    """clickhouse_connect's insert context keeps a bound method of its own (a reference
    cycle), so each insert's context and the rows it holds were freed only by the cyclic
    collector, which long-running processes run seldom (loom.gc_tuning): the worker's
    vectors piled up between collections. The cycle is cut here (tests/test_rows_insert.py
    pins that no context outlives its insert)."""
    context.data = None
    for attr in ("_next_block_data", "_block_rows", "_block_columns"):
        vars(context).pop(attr, None)
