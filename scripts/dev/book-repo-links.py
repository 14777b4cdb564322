#!/usr/bin/env python3
"""mdBook preprocessor: links from the book to files of the repository outside the book.

A page of docs/src links to the repository's files as GitHub shows them
(`[text](../../scripts/demo.sh)`): right on GitHub, dead in the built book, which holds
only docs/src. In the book such a link becomes the file's path as code (`scripts/demo.sh`),
or a link to it under `url` when book.toml gives one:

    [preprocessor.repo-links]
    command = "python3 ../scripts/dev/book-repo-links.py"
    url = "https://github.com/OWNER/gpucap/blob/main"   # optional

Links inside the book, to anchors and to the web are left as they are. Code blocks and
inline code are left alone. tests/documents/readme.rs builds the book and checks every link of
its HTML.
"""
import json
import posixpath
import re
import sys

# [text](target) not preceded by '!' (images stay) whose target leaves docs/src: ../…
LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\((\.\./[^)\s]*)\)")
CODE = re.compile(r"(`+)[^`]*?\1")
FENCE = re.compile(r"^\s*(```|~~~)")


def repo_path(target: str) -> str:
    """The repository path a link of a page of docs/src names (`../gpu-runs/x` is docs/gpu-runs/x)."""
    path = posixpath.normpath(posixpath.join("docs/src", target.split("#", 1)[0]))
    return path


def rewrite_line(line: str, url: str | None) -> str:
    # A link that starts inside an inline code span is code, not a link: left alone.
    code = [m.span() for m in CODE.finditer(line)]

    def one(m: re.Match) -> str:
        if any(a < m.start() < b for a, b in code):
            return m.group(0)
        text, target = m.group(1), m.group(2)
        path = repo_path(target)
        if path.startswith("docs/src/") or path == "docs/src":
            return m.group(0)  # inside the book after all
        if url:
            fragment = "#" + target.split("#", 1)[1] if "#" in target else ""
            return f"[{text}]({url.rstrip('/')}/{path}{fragment})"
        if text.strip("`").rstrip("/") == path:
            return f"`{path}`"
        return f"{text} (`{path}` in the repository)"

    return LINK.sub(one, line)


def rewrite(content: str, url: str | None) -> str:
    lines, fenced = [], False
    for line in content.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append(line)
            continue
        lines.append(line if fenced else rewrite_line(line, url))
    return "\n".join(lines)


def walk(items, url):
    for item in items:
        chapter = item.get("Chapter") if isinstance(item, dict) else None
        if chapter:
            chapter["content"] = rewrite(chapter["content"], url)
            walk(chapter.get("sub_items", []), url)


def main() -> int:
    if len(sys.argv) > 1:  # `supports RENDERER`: every renderer
        return 0
    context, book = json.load(sys.stdin)
    conf = context.get("config", {}).get("preprocessor", {}).get("repo-links", {})
    walk(book.get("items", book.get("sections", [])), conf.get("url"))
    json.dump(book, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
