"""docs/trl_migration.md's config-field sections say what RLOOConfig does: a field the page calls refused is
refused (a non-default value raises a ConfigError that names it), and a field it calls honoured, mapped or
accepted is taken with TRL 1.16's default (read from TRL's own RLOOConfig) and is not refused in the code's
table (compat/config_fields.py)."""

import dataclasses
from pathlib import Path

import pytest

from rloo import ConfigError, RLOOConfig
from rloo.compat.config_fields import TRL_FIELDS

trl = pytest.importorskip("trl")

DOC = Path(__file__).resolve().parents[2] / "docs" / "trl_migration.md"
OWN = {field.name for field in dataclasses.fields(RLOOConfig)}
TRL_DEFAULTS = {field.name: field.default for field in dataclasses.fields(trl.RLOOConfig)
                if field.default is not dataclasses.MISSING}


def sections() -> dict[str, list[str]]:
    """The fields named in each `###` section under "## Config fields": the first code span of each table
    row, and every code span of the "Honoured as is" paragraph."""
    found, section = {}, None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = None
        if line.startswith("### "):
            section = line[4:]
            found[section] = []
        elif section and line.startswith("| `"):
            found[section].append(line.split("`")[1])
        elif section and section.startswith("Honoured as is") and line.startswith("`"):
            found[section] += line.split("`")[1::2]
    return found


SECTIONS = sections()
REFUSED = next(names for title, names in SECTIONS.items() if title.startswith("Refused"))
TAKEN = {title: names for title, names in SECTIONS.items()
         if title.startswith(("Honoured", "Defaults", "Mapped", "Accepted"))}


def probe(default):
    """A value other than TRL's default, of the same kind."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if isinstance(default, str):
        return default + "-other" if default else "other"
    if isinstance(default, (list, tuple)):
        return ["other"]
    return "other"  # None, and dicts


def test_the_page_has_the_sections_the_test_reads():
    assert len(REFUSED) > 40
    assert set(TAKEN) == {"Honoured as is (same name, same meaning)", "Defaults that differ from TRL's",
                          "Mapped onto rloo's fields", "Accepted (what rloo does anyway, or read by scripts)",
                          "Honoured, with what to know"}


@pytest.mark.parametrize("name", REFUSED)
def test_a_field_the_page_calls_refused_is_refused(name, tmp_path):
    answer = TRL_FIELDS.get(name)
    assert name not in OWN and answer is not None and answer.kind == "refused", (
        f"docs/trl_migration.md calls {name} refused, but the code {'honours it' if name in OWN else 'takes it'}")
    value = probe(answer.default)
    assert answer.ok is None or not answer.ok(value), f"{value!r} is a value {name} accepts"
    with pytest.raises(ConfigError, match=name):
        RLOOConfig(output_dir=str(tmp_path), **{name: value})
    RLOOConfig(output_dir=str(tmp_path), **{name: answer.default})  # TRL's default is always accepted


TAKEN_NAMES = sorted({name for names in TAKEN.values() for name in names})


@pytest.mark.parametrize("name", TAKEN_NAMES)
def test_a_field_the_page_calls_honoured_mapped_or_accepted_is_taken(name, tmp_path):
    answer = TRL_FIELDS.get(name)
    assert name in OWN or (answer is not None and answer.kind != "refused"), f"the code refuses {name}"
    if name in TRL_DEFAULTS and name != "output_dir":
        RLOOConfig(output_dir=str(tmp_path), **{name: TRL_DEFAULTS[name]})


def test_each_section_agrees_with_the_code_table():
    mapped = next(names for title, names in TAKEN.items() if title.startswith("Mapped"))
    accepted = next(names for title, names in TAKEN.items() if title.startswith("Accepted"))
    assert [n for n in mapped if n not in OWN and TRL_FIELDS[n].kind != "mapped"] == []
    assert [n for n in accepted if n in OWN or TRL_FIELDS[n].kind != "accepted"] == []


def differing_defaults_table() -> dict[str, tuple[str, str]]:
    """The "Defaults that differ from TRL's" table: field -> (TRL 1.16 column, rloo column), as written."""
    rows, inside = {}, False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            inside = line.startswith("### Defaults that differ")
        elif inside and line.startswith("| `"):
            cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_the_differing_defaults_table_is_the_codes():
    """Every field both configs have whose defaults differ has a row, and each row's two defaults are the code's
    (rloo.config.RLOOConfig's, and TRL's own RLOOConfig's)."""
    import ast

    from rloo.config import RLOOConfig as CoreConfig

    ours = {f.name: f.default for f in dataclasses.fields(CoreConfig) if f.default is not dataclasses.MISSING}
    differing = sorted(n for n in ours if n in TRL_DEFAULTS and ours[n] != TRL_DEFAULTS[n])
    table = differing_defaults_table()
    assert sorted(table) == differing, "docs/trl_migration.md's table of differing defaults is not the code's"
    written = {name: (ast.literal_eval(trl_value), ast.literal_eval(rloo_value))
               for name, (trl_value, rloo_value) in table.items()}
    assert written == {name: (TRL_DEFAULTS[name], ours[name]) for name in differing}
