#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Makes the Markdown source of a man page from Documentation/man/NAME.md.

Fills in @VERSION@, @PROVIDER@, @PROVIDER_FROM_BINDIR@ and @DRIVER_FILE@, and two sections that
come from the built `usiw` command itself, so that the man page and
`usiw --help` say the same thing from one table:
  @SETTINGS@  the settings `usiw --help` lists under "Tuning"
  @COUNTERS@  the counters `usiw stat --describe` lists
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


def settings(usiw):
    """`usiw --help`'s Tuning section as a Markdown definition list. An
    entry is a line indented by 2 that starts with a variable's name
    ("  NAME = VALUES"), followed by its meaning, indented further; other
    lines indented by 2 are the section's introduction (already in the
    page's own words)."""
    help_text = subprocess.run([usiw, "--help"], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    try:
        start = next(i for i, line in enumerate(help_text) if line.startswith("Tuning"))
    except StopIteration:
        sys.exit("man_source.py: `usiw --help` has no Tuning section")
    entries = []
    for line in help_text[start + 1:]:
        if line and not line.startswith(" "):
            break  # the next section
        if re.match(r"^  [A-Z][A-Z0-9_]* = ", line):
            entries.append([line.strip(), []])
        elif line.startswith("    ") and entries:
            entries[-1][1].append(line.strip())
    if not entries:
        sys.exit("man_source.py: no settings found in `usiw --help`'s Tuning section")
    out = []
    for term, meaning in entries:
        # The variables' names in bold, the rest as usiw --help has it.
        term = "".join(
            "**%s**" % part if re.fullmatch(r"[A-Z][A-Z0-9_]+", part) else markdown_text(part)
            for part in re.split(r"([A-Z][A-Z0-9_]+)", term))
        out.append(term)
        out.append(":   " + markdown_text(" ".join(meaning)))
        out.append("")
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
    if "@SETTINGS@" in text:
        text = text.replace("@SETTINGS@", settings(args.usiw))
    if "@COUNTERS@" in text:
        text = text.replace("@COUNTERS@", counters(args.usiw))
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        sys.exit("man_source.py: %s: unknown placeholders %s" % (args.source, leftover))
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(text)


if __name__ == "__main__":
    main()
