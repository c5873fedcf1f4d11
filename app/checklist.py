"""Review checklists: the questions a review job asks of every document.

A checklist is a YAML (`.yaml`/`.yml`) or TOML (`.toml`) file:

    name: contract-review            # required; letters, digits, "-", "_", "."
    description: Clauses a lawyer checks first.
    items:
      - id: governing_law            # required, unique; lowercase letters, digits, "_", "-", "."
        question: Which jurisdiction's law governs the agreement?
        type: party                  # yes_no | date | party | duration | amount | text (default text)
        hints: [governed by, laws of the State of]    # extra search terms, never shown to the model as the question
        anchors: ["Governing Law"]   # defined terms, section titles or clause references ("Section 7.1") to steer retrieval
      - id: convenience_vs_term
        question: Does termination for convenience undercut the fixed term?
        compare: [term, termination_for_convenience]  # a conflict item: two other, non-compare items

Every item is asked of every document. A `compare` item asks nothing itself: it reads the
answers to its two items on the same document and reports `[CONFLICT: a vs b]` findings
that cite both clauses (see `pipelines.answer.conflicts`). Unknown keys are errors, so a typo
("hint:") is reported instead of silently ignored.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import DocqaError

AnswerType = Literal["yes_no", "date", "party", "duration", "amount", "text"]

_ID = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
BUILTIN_DIR = Path(__file__).with_name("checklists")


class ChecklistError(DocqaError):
    """A checklist file that cannot be read or does not follow the schema."""


class ChecklistItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=_ID)
    question: str = Field(min_length=3, max_length=2000)
    type: AnswerType = "text"
    hints: list[str] = Field(default_factory=list)
    anchors: list[str] = Field(default_factory=list)
    compare: tuple[str, str] | None = None

    @field_validator("question")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = " ".join(v.split())
        if len(v) < 3:
            raise ValueError("question is empty")
        return v

    @field_validator("hints", "anchors")
    @classmethod
    def _terms(cls, v: list[str]) -> list[str]:
        terms = [" ".join(t.split()) for t in v]
        if any(not t for t in terms):
            raise ValueError("empty term")
        return terms

    def query(self) -> str:
        """The text retrieval searches with: the question, then its anchors and hints.

        Anchors (capitalised names) also reach retrieval as mentions of defined terms."""
        extra = [*self.anchors, *self.hints]
        return self.question if not extra else f"{self.question} (Related: {'; '.join(extra)}.)"


class Checklist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    items: list[ChecklistItem] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Checklist:
        ids = [i.id for i in self.items]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate item id {dup[0]!r}")
        plain = {i.id for i in self.items if i.compare is None}
        for item in self.items:
            if item.compare is None:
                continue
            a, b = item.compare
            if a == b:
                raise ValueError(f"item {item.id!r} compares {a!r} with itself")
            for ref in (a, b):
                if ref not in ids:
                    raise ValueError(f"item {item.id!r} compares unknown item {ref!r}")
                if ref not in plain:
                    raise ValueError(f"item {item.id!r} compares {ref!r}, itself a compare item")
        return self

    @property
    def questions(self) -> list[ChecklistItem]:
        return [i for i in self.items if i.compare is None]

    @property
    def comparisons(self) -> list[ChecklistItem]:
        return [i for i in self.items if i.compare is not None]

    def item(self, item_id: str) -> ChecklistItem:
        return next(i for i in self.items if i.id == item_id)

    def digest(self) -> str:
        """Identity of the checklist's content (a resumed job must use the same one)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def parse_checklist(text: str, *, fmt: Literal["yaml", "toml"], source: str = "<checklist>") -> Checklist:
    try:
        data = tomllib.loads(text) if fmt == "toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ChecklistError(f"{source}: not valid {fmt.upper()}: {first}") from None
    if not isinstance(data, dict):
        raise ChecklistError(f"{source}: expected a mapping with 'name' and 'items' at the top")
    try:
        return Checklist.model_validate(data)
    except ValidationError as e:
        raise ChecklistError(f"{source}: {_first_error(e, data)}") from None


def _first_error(e: ValidationError, data: dict) -> str:
    """One line naming where the first problem is: 'items[3] (id 'x').type: ...'."""
    err = e.errors()[0]
    loc = list(err["loc"])
    where = ""
    if len(loc) >= 2 and loc[0] == "items" and isinstance(loc[1], int):
        items = data.get("items") or []
        item_id = items[loc[1]].get("id") if loc[1] < len(items) and isinstance(items[loc[1]], dict) else None
        where = f"items[{loc[1]}]" + (f" (id {item_id!r})" if item_id else "")
        loc = loc[2:]
    rest = ".".join(str(p) for p in loc)
    where = ".".join(p for p in (where, rest) if p)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key missing"
    elif err["type"] == "literal_error":
        msg = f"must be one of {', '.join(AnswerType.__args__)}"
    return f"{where}: {msg}" if where else msg


def load_checklist(path: str | Path) -> Checklist:
    """Read a checklist file; a bare name ("contract_review") means a built-in one."""
    p = Path(path)
    if not p.exists() and not p.suffix and (BUILTIN_DIR / f"{p.name}.yaml").exists():
        p = BUILTIN_DIR / f"{p.name}.yaml"
    suffix = p.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ChecklistError(f"{path}: a checklist is a .yaml, .yml or .toml file")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChecklistError(f"{path}: no such checklist file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ChecklistError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return parse_checklist(text, fmt="toml" if suffix == ".toml" else "yaml", source=str(path))


def checklist_json(checklist: Checklist) -> str:
    return json.dumps(checklist.model_dump(mode="json"), ensure_ascii=False)
