"""The ``-o`` options: their parsing, and the one table against what shows it.

``mountd.config`` declares every option once, on its ``MountConfig`` field or
in ``MOUNT8_OPTIONS``. ``--help`` is made from that table when it runs; the
README's list is made from it by this module: after a change of the table,
``python -m tests.test_options`` writes the list again. The tests check that
the table, ``MountConfig``, ``--help`` and the README agree (every option in
each, with the same default, and each default as shown parses back to the
field's default), and that bad values get the messages they always had.

Concurrency: none; pytest runs these one at a time, and ``main`` is run by hand.
"""

from __future__ import annotations

import dataclasses
import os
import re
import textwrap
from pathlib import Path

import pytest

from mountd.cli import build_parser, parse_args
from mountd.config import (
    FIELD_OPTIONS,
    FLAG,
    MOUNT8_OPTIONS,
    MountConfig,
    OptionError,
    apply_options,
    help_entries,
)

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = "<!-- -o options: made from mountd/config.py by `python -m tests.test_options` -->\n"
END = "<!-- end of the -o options -->"
#: The fields set on the command line alone, and the one the kernel flags fill.
NOT_OPTIONS = {"source", "mountpoint", "foreground", "kernel_options"}


def readme_list() -> str:
    """The README's list of options, made from the table (Markdown)."""
    lines = []
    for spellings, text in help_entries():
        head = ", ".join(f"`{spelling}`" for spelling in spellings)
        lines += textwrap.wrap(f"- {head}: {text}", 79, subsequent_indent="  ",
                               break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines) + "\n"


def readme_section(readme: str) -> str:
    """The list between the README's markers."""
    start = readme.index(BEGIN) + len(BEGIN)
    return readme[start:readme.index(END, start)]


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_lists_every_option(listing: str, code: bool) -> None:
    """``listing`` shows every option of the table, in order, each with its whole
    help and, for a ``MountConfig`` field, its default (``code``: the README's
    Markdown, names in backquotes; else ``--help``'s plain text)."""
    def names(*spellings: str) -> str:
        return ", ".join(f"`{s}`" if code else s for s in spellings) + (":" if code else "")

    entries = [f"{names(name + opt.kind.spelt)} {opt.help} (default: {opt.default})"
               for name, opt in FIELD_OPTIONS.items()]
    entries += [f"{names(*mount8.names)} {mount8.help}" for mount8 in MOUNT8_OPTIONS]
    listing, at = flat(listing), 0
    for entry in (flat(e if code else e.replace("`", "")) for e in entries):
        found = listing.find(entry, at)
        assert found >= 0, f"missing or out of order: {entry}"
        at = found + len(entry)


# ------------------------------------------------------------ the table


def test_every_field_but_the_command_line_is_an_option() -> None:
    names = {f.name for f in dataclasses.fields(MountConfig)}
    assert set(FIELD_OPTIONS) == names - NOT_OPTIONS
    mount8 = [name for entry in MOUNT8_OPTIONS for name in entry.names]
    assert len(mount8) == len(set(mount8)) and not set(mount8) & names


@pytest.mark.parametrize("name", sorted(FIELD_OPTIONS))
def test_shown_default_is_the_default(name: str) -> None:
    opt = FIELD_OPTIONS[name]
    spec = next(f for f in dataclasses.fields(MountConfig) if f.name == name)
    if spec.default is dataclasses.MISSING or spec.default is None:
        # uid and gid (the mounting user's), and options left unset: told in words
        assert opt.default and opt.default != "None"
    elif opt.kind is FLAG:
        assert spec.default is False and opt.default == "off"
    else:
        config = MountConfig("s3://b", "/mnt", **{name: None})
        apply_options(config, [f"{name}={opt.default}"])
        assert getattr(config, name) == spec.default


def test_help_lists_every_option_with_its_default() -> None:
    text = build_parser().format_help()
    section = text[text.index("mount options (-o"):text.index("exit status:")]
    assert_lists_every_option(section, code=False)
    assert "(default: None)" not in text


def test_readme_list_is_made_from_the_table() -> None:
    section = readme_section(README.read_text())
    assert section == readme_list(), "run: python -m tests.test_options"
    assert_lists_every_option(section, code=True)


def test_defaults_the_readme_gives_elsewhere_are_the_table_s() -> None:
    # e.g. "`-o cache_size=SIZE` (default 512M)" in the S3 section
    said = re.findall(r"(\w+)=[A-Z]+`\s+\(default ([^:;,)]+)", README.read_text())
    assert said
    for name, default in said:
        assert default == FIELD_OPTIONS[name].default, name


# ------------------------------------------------------------ parsing


@pytest.mark.parametrize(("option", "message"), [
    ("uid", "option uid needs a value (uid=...)"),
    ("uid=x", "option uid=x: not a number"),
    ("gid=-1", "option gid=-1: must not be negative"),
    ("h5view_objects=1.5", "option h5view_objects=1.5: not a number"),
    ("metadata_ttl=", "option metadata_ttl=: not a number"),
    ("metadata_ttl=-1", "option metadata_ttl=-1: must not be negative"),
    ("timeout=0", "option timeout=0: must be more than 0 seconds"),
    ("timeout=0.0", "option timeout=0: must be more than 0 seconds"),
    ("chunk_cache", "option chunk_cache needs a size (chunk_cache=256M)"),
    ("readahead=lots", "option readahead=lots: not a size"),
    ("cache_size=-1M", "option cache_size=-1M: not a size"),
    ("max_metadata=0", "option max_metadata=0: must be at least 1 byte"),
    ("chunk_cache=nan", "option chunk_cache=nan: not a size"),
    ("cache_size=infG", "option cache_size=infG: not a size"),
    ("metadata_ttl=nan", "option metadata_ttl=nan: not a number"),
    ("timeout=inf", "option timeout=inf: not a number"),
    ("allow_other=maybe", "option allow_other=maybe: say allow_other or allow_other=off"),
    ("fsname=", "option fsname needs a value"),
    ("endpoint_url", "option endpoint_url needs a value"),
    ("cache_dir", "option cache_dir needs a directory"),
    ("stats_file=", "option stats_file needs a path"),
    ("acl_map", "option acl_map needs a file"),
    ("h5view", "option h5view: say h5view=on or h5view=off"),
    ("h5view=yes", "option h5view=yes: say h5view=on or h5view=off"),
    ("cache_decoded=", "option cache_decoded=: say cache_decoded, cache_decoded=on or "
                       "cache_decoded=off"),
    ("log_level=", "option log_level=: the level is one of DEBUG, INFO, WARNING, ERROR "
                   "(log_level=info)"),
    ("rw", "h5mount mounts are read-only; option rw is not supported (mount(8) adds rw "
           "unless the options say ro: add ro)"),
    ("RO", "unknown option: RO"),
    ("bogus=1", "unknown option: bogus=1"),
    ("cache_decoded=on", "option cache_decoded needs cache_dir (cache_dir=DIR,cache_decoded)"),
])
def test_bad_value_messages(option: str, message: str) -> None:
    with pytest.raises(OptionError) as info:
        apply_options(MountConfig("s3://b", "/mnt"), [option])
    assert str(info.value) == message


def test_values_are_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = MountConfig("s3://b", "/mnt")
    apply_options(config, [" uid=7,gid=8 ,allow_other=yes,anon,metadata_ttl=1.5,timeout=2",
                           "chunk_cache=1.5K,readahead=0,cache_size=2MiB,cache_dir=c,h5view=off",
                           "acl_map=m,log_level=Debug,fsname=x=y,user=alice,comment=a,"
                           "x-systemd.automount,X-mount.mkdir,relatime,ro,nosuid,dev,nosuid,,"])
    assert (config.uid, config.gid, config.allow_other, config.anon) == (7, 8, True, True)
    assert (config.metadata_ttl, config.timeout) == (1.5, 2.0)
    assert (config.chunk_cache, config.readahead, config.cache_size) == (1536, 0, 2 << 20)
    assert (config.cache_dir, config.acl_map) == (str(tmp_path / "c"), str(tmp_path / "m"))
    assert config.hsds_acls and not config.h5view
    assert (config.log_level, config.fsname) == ("DEBUG", "x=y")
    assert config.kernel_options == ["nosuid", "dev", "nosuid"]
    # a flag said off is off, not on
    apply_options(config, ["allow_other=no,anon=off"])
    assert (config.allow_other, config.anon) == (False, False)


if __name__ == "__main__":
    text = README.read_text()
    start = text.index(BEGIN) + len(BEGIN)
    README.write_text(text[:start] + readme_list() + text[text.index(END, start):])


def test_a_service_path_is_kept_and_a_url_with_endpoint_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """With ``-o endpoint=`` SOURCE is a path on the service, not made absolute
    against the working directory as a local path is; a URL there is refused."""
    assert parse_args(["/home/u/", "/mnt", "-o", "endpoint=http://h:5101"]).source == "/home/u/"
    assert parse_args(["rel/dir", "/mnt"]).source == os.path.abspath("rel/dir")
    with pytest.raises(SystemExit) as caught:
        parse_args(["s3://bucket", "/mnt", "-o", "endpoint=http://h:5101"])
    assert caught.value.code == 2
    assert "SOURCE is a folder or domain path" in capsys.readouterr().err
