"""Every CLI command is documented in the README, and every command's help ends with an example."""

import re
from pathlib import Path

import typer.main

from docqa.app.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _commands(group, prefix=""):
    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, cmd in click_group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def test_every_command_is_in_the_readme_with_an_example_in_its_help():
    names = []
    for name, cmd in _commands(typer.main.get_command(app)):
        names.append(name)
        assert re.search(rf"docqa {re.escape(name)}\b", README), f"`docqa {name}` is not in README.md"
        assert "Example: docqa" in (cmd.help or ""), f"`docqa {name} --help` has no example"
    assert {"ingest", "ask", "review", "export", "browse", "engine generate"} <= set(names)
