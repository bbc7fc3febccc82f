"""``check_call`` and path rules (DESIGN §6, §10): one unit test per rule, in priority order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.models import Capability, Permissions
from jupyter_goals.runtime.permissions import CallFacts, check_call, path_rule_matches
from jupyter_goals.runtime.tools import BUILTINS, ToolRegistry, trusted_probe

UNKNOWN = [{"call_id": "req_1:0", "tool": "shell", "arguments": {"command": "rm -rf build"}}]


def facts(tool: str = "write_file", capability: Capability = Capability.IDEMPOTENT, probe: bool = False,
          **arguments: Any) -> CallFacts:
    return CallFacts(tool=tool, arguments=arguments, capability=capability, trusted_probe=probe)


def test_builtin_probes_are_trusted_by_identity_and_digest_only() -> None:
    for spec in BUILTINS:
        expected = spec.capability in (Capability.READ_ONLY, Capability.STATE_PROBE)
        assert trusted_probe(spec.identity, spec.digest) is expected, spec.name
    read = ToolRegistry().get("read_file")
    assert read is not None
    assert not trusted_probe(read.identity, "0" * 16)  # a changed implementation is not trusted
    custom = ToolRegistry({"read_secret_writer": {"impl": "tests.sample_tools:read_secret_writer", "capability": "read_only"}})
    spec = custom.get("read_secret_writer")
    assert spec is not None and spec.capability == Capability.READ_ONLY
    assert not trusted_probe(spec.identity, spec.digest)


def test_unknown_effects_allow_only_trusted_probes_whatever_the_mode_and_rules(tmp_path: Path) -> None:
    everything = {"mode": "bypass", "allow": ["write_file", {"tool": "write_file", "path": "**"}]}
    assert check_call(facts("read_file", Capability.READ_ONLY, probe=True), everything, str(tmp_path), UNKNOWN).run
    for call in (facts(path="a.md"), facts("custom_read", Capability.READ_ONLY)):
        verdict = check_call(call, everything, str(tmp_path), UNKNOWN)
        assert not verdict.run and verdict.restricted
        assert "req_1:0" in verdict.reason and "bypass" in verdict.reason


def test_without_unknown_effects_registry_read_only_runs_in_ask_mode(tmp_path: Path) -> None:
    assert check_call(facts("custom_read", Capability.READ_ONLY), {"mode": "ask"}, str(tmp_path), []).run
    assert not check_call(facts("read_secret_writer", Capability.UNKNOWN), {"mode": "ask"}, str(tmp_path), []).run


def test_bypass_runs_everything_without_unknown_effects(tmp_path: Path) -> None:
    assert check_call(facts("shell", Capability.UNKNOWN), {"mode": "bypass"}, str(tmp_path), []).run


def test_tool_name_rule_and_path_rule(tmp_path: Path) -> None:
    perms = {"mode": "ask", "allow": ["shell", {"tool": "write_file", "path": "notes/*.md"}]}
    assert check_call(facts("shell", Capability.UNKNOWN, command="ls"), perms, str(tmp_path), []).run
    assert check_call(facts(path="notes/a.md"), perms, str(tmp_path), []).run
    assert not check_call(facts("edit_file", Capability.UNKNOWN, path="notes/a.md"), perms, str(tmp_path), []).run
    verdict = check_call(facts(path="notes/a.txt"), perms, str(tmp_path), [])
    assert not verdict.run and not verdict.restricted and "ask mode" in verdict.reason


@pytest.mark.parametrize(
    ("pattern", "target", "matches"),
    [
        ("notes/*.md", "notes/a.md", True),
        ("notes/*.md", "./notes/../notes/a.md", True),
        ("notes/*.md", "notes/sub/a.md", False),  # '*' stays within one directory
        ("notes/**/*.md", "notes/sub/deep/a.md", True),
        ("notes/**/*.md", "notes/a.md", True),
        ("notes/*.md", "../notes/a.md", False),
        ("notes/*.md", "notes/link.md", False),  # a symlink pointing outside
        ("notes/*.md", "", False),
        ("*.md", "{cwd}/top.md", True),  # absolute argument inside the glob
    ],
)
def test_path_rule_resolves_the_argument_inside_the_glob(tmp_path: Path, pattern: str, target: str, matches: bool) -> None:
    (tmp_path / "notes").mkdir()
    os.symlink(tmp_path.parent / "elsewhere.md", tmp_path / "notes" / "link.md")
    rule = {"tool": "write_file", "path": pattern}
    args = {"path": target.format(cwd=tmp_path)}
    assert path_rule_matches(rule, "write_file", args, str(tmp_path)) is matches


def test_path_rule_needs_a_path_argument_and_the_same_tool(tmp_path: Path) -> None:
    rule = {"tool": "write_file", "path": "**"}
    assert not path_rule_matches(rule, "write_file", {"content": "x"}, str(tmp_path))
    assert not path_rule_matches(rule, "edit_file", {"path": "a"}, str(tmp_path))


def test_permissions_model_keeps_names_and_accepts_path_rules() -> None:
    perms = Permissions.model_validate({"mode": "ask", "allow": ["shell", {"tool": "write_file", "path": "n/*.md"}]})
    assert perms.model_dump() == {"mode": "ask", "allow": ["shell", {"tool": "write_file", "path": "n/*.md"}], "folders": [], "env_allow": []}
    with pytest.raises(ValueError):
        Permissions.model_validate({"allow": [{"tool": "write_file", "path": "x", "mode": "rw"}]})
