#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Makes the Markdown source of a man page from Documentation/man/NAME.md.

Fills in @VERSION@, @PROVIDER@, @PROVIDER_FROM_BINDIR@ and @DRIVER_FILE@, and the
sections that come from the built `usiw` command itself, so that the man
pages and `usiw --help` say the same thing from one table:
  @ENVIRONMENT@         every setting of the registry (host/settings.h), as
                        `usiw --help` lists them under "Environment", by
                        who reads them
  @ENVIRONMENT(T1|T2)@  only the subsections whose titles start with T1 or T2
  @COUNTERS@            the counters `usiw stat --describe` lists
pandoc then renders the result (CMakeLists.txt in this directory).

Usage: man_source.py --usiw BIN --version V --provider PATH --provider-from-bindir PATH
                     --driver-file PATH IN OUT
"""
import argparse
import re
import subprocess
import sys


def markdown_text(text):
    """Plain text as Markdown that renders as the same text."""
    return re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", text)


def environment(usiw):
    """`usiw --help`'s Environment section (the settings registry,
    host/settings.h): a list of (title, entries) subsections, each entry
    (name, values, meaning). A subsection's title is the text indented by 2
    (it may take several lines and ends with ':'); an entry starts with a
    line indented by 4, "NAME = VALUES", and its meaning follows, indented
    further."""
    help_text = subprocess.run([usiw, "--help"], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    try:
        start = next(i for i, line in enumerate(help_text) if line.startswith("Environment"))
    except StopIteration:
        sys.exit("man_source.py: `usiw --help` has no Environment section")
    # The section's own heading may wrap; it ends with the first line ending in ':'.
    while not help_text[start].endswith(":"):
        start += 1
    sections = []
    for line in help_text[start + 1:]:
        if not line.strip() or not line.startswith("  "):
            break  # the end of the section
        entry = re.match(r"^    ([A-Z][A-Z0-9_]*) = (.*)$", line)
        if entry:
            if not sections:
                sys.exit("man_source.py: a setting before any title: %r" % line)
            sections[-1][1].append([entry.group(1), entry.group(2), []])
        elif line.startswith("      "):
            if not sections or not sections[-1][1]:
                sys.exit("man_source.py: a meaning before any setting: %r" % line)
            sections[-1][1][-1][2].append(line.strip())
        else:  # indented by 2: a title, or the next line of one
            if sections and not sections[-1][1]:
                sections[-1][0] += " " + line.strip()
            else:
                sections.append([line.strip(), []])
    if not sections or not all(entries for _, entries in sections):
        sys.exit("man_source.py: `usiw --help`'s Environment section has a title without settings")
    return sections


def environment_markdown(usiw, wanted):
    """The subsections of `usiw --help`'s Environment section whose titles
    start with one of `wanted` (all when it is empty), as Markdown: each
    title a paragraph, its settings a definition list (the name in bold,
    the values and the meaning as `usiw --help` has them)."""
    out = []
    used = set()
    for title, entries in environment(usiw):
        match = [w for w in wanted if title.startswith(w)]
        if wanted and not match:
            continue
        used.update(match)
        out.append(markdown_text(title))
        out.append("")
        for name, values, meaning in entries:
            out.append("**%s** = %s" % (markdown_text(name), markdown_text(values)))
            out.append(":   " + markdown_text(" ".join(meaning)))
            out.append("")
    missing = [w for w in wanted if w not in used]
    if missing:
        sys.exit("man_source.py: no subsection of `usiw --help`'s Environment section starts "
                 "with %s" % missing)
    return "\n".join(out).rstrip("\n")


def counters(usiw):
    """`usiw stat --describe` ("name  meaning" lines) as a definition list."""
    lines = subprocess.run([usiw, "stat", "--describe"], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    out = []
    for line in lines:
        name, _, meaning = line.partition(" ")
        if not name or not meaning.strip():
            sys.exit("man_source.py: unexpected `usiw stat --describe` line: %r" % line)
        out.append("**%s**" % markdown_text(name))
        out.append(":   " + markdown_text(meaning.strip()))
        out.append("")
    if not out:
        sys.exit("man_source.py: `usiw stat --describe` printed nothing")
    return "\n".join(out).rstrip("\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--usiw", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--provider-from-bindir", required=True)
    parser.add_argument("--driver-file", required=True)
    parser.add_argument("source")
    parser.add_argument("output")
    args = parser.parse_args()
    text = open(args.source, encoding="utf-8").read()
    text = (text.replace("@VERSION@", args.version)
            .replace("@PROVIDER@", args.provider)
            .replace("@PROVIDER_FROM_BINDIR@", args.provider_from_bindir)
            .replace("@DRIVER_FILE@", args.driver_file))
    # @ENVIRONMENT@: every setting; @ENVIRONMENT(TITLE|TITLE...)@: the
    # subsections whose titles start so.
    text = re.sub(r"@ENVIRONMENT(?:\(([^)@]*)\))?@",
                  lambda m: environment_markdown(
                      args.usiw, [w for w in (m.group(1) or "").split("|") if w]), text)
    if "@COUNTERS@" in text:
        text = text.replace("@COUNTERS@", counters(args.usiw))
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        sys.exit("man_source.py: %s: unknown placeholders %s" % (args.source, leftover))
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(text)


if __name__ == "__main__":
    main()
