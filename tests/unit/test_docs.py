"""The man page agrees with its scdoc source and names every CLI command and option."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click

from sandboxd.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCD = ROOT / "man" / "sandboxd.1.scd"
ROFF = ROOT / "man" / "sandboxd.1"


def _without_date(roff: str) -> str:
    # scdoc stamps the build date into .TH; the rest must match exactly.
    return re.sub(r'^\.TH "sandboxd" "1" "[^"]*"', '.TH "sandboxd" "1" ""', roff, flags=re.M)


def test_generated_man_page_matches_its_source():
    generated = subprocess.run(
        ["scdoc"], input=SCD.read_text(), capture_output=True, text=True, check=True
    ).stdout
    assert _without_date(generated) == _without_date(ROFF.read_text()), (
        "man/sandboxd.1 is stale: run `scdoc < man/sandboxd.1.scd > man/sandboxd.1`"
    )


def _commands_and_options() -> list[str]:
    names: list[str] = []
    ctx = click.Context(main)

    def walk(command: click.Command) -> None:
        for param in command.params:
            names.extend(o for o in param.opts if o.startswith("--"))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                names.append(name)
                walk(sub)

    walk(main)
    del ctx
    return names


def test_every_command_and_option_is_in_the_man_page():
    text = SCD.read_text()
    missing = [n for n in _commands_and_options() if f"*{n}*" not in text]
    assert missing == []
