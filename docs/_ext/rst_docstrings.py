"""A griffe extension that renders the reST idioms of replaybuffer's docstrings.

The docstrings are Google-style sections (``Args:``, ``Returns:``, ``Raises:``) around
prose that uses a few reST constructs; this turns them into Markdown before
mkdocstrings parses them:

* roles (``:class:`~replaybuffer.ArraySpec```, ``:meth:`add_batch```) become optional
  cross-references: a link when the target is documented, plain code otherwise;
* a paragraph ending in ``::`` introduces a literal block: it becomes a fenced block;
* simple tables (rows between ``====  ====`` rules) become Markdown tables;
* ``>>>`` sessions become ``pycon`` code blocks;
* ``a, b: text`` entries of ``Args:``/``Attributes:`` become one entry per name;
* bullet lists get the blank lines and 4-space continuations Python-Markdown needs.

Double-backtick literals need nothing: Markdown reads ````x```` as code.
Only the docs build loads this file; the source is not changed.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|meth|func|mod|attr|data|exc|obj):`(~?)([^`]+?)`")
_RULE = re.compile(r"^(\s*)(=+)(\s+=+)+\s*$")
_ITEM = re.compile(r"^(\s*)([*-]|\d+\.)\s+\S")
_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Attributes|Keyword Args|"
                      r"Other Parameters):\s*$")
_SHARED = re.compile(r"^(\s+)(\w+(?:\s*,\s*\w+)+)(\s*\([^)]*\))?:(\s.*|)$")


class RstDocstrings(griffe.Extension):
    """Rewrite every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: Any, **kwargs: Any) -> None:
        self._collection = loader.modules_collection
        self._walk(pkg, set())

    def _walk(self, obj: Any, seen: set[str]) -> None:
        if obj.is_alias or obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = self.convert(obj.docstring.value, obj)
        for member in list(obj.members.values()):
            self._walk(member, seen)

    # ------------------------------------------------------------------ roles
    def _target(self, name: str, scope: Any) -> str:
        """The canonical path of ``name`` seen from ``scope`` (``name`` if unknown)."""
        name = name.strip().rstrip("()")
        head, _, rest = name.partition(".")
        candidates = [name]
        try:
            resolved = scope.resolve(head)
            candidates.insert(0, f"{resolved}.{rest}" if rest else resolved)
        except Exception:  # not a name in scope: maybe already a full path
            pass
        for candidate in candidates:
            try:
                obj = self._collection.get_member(candidate)
            except Exception:
                continue
            try:
                return obj.final_target.path if obj.is_alias else obj.path
            except Exception:
                return candidate
        return name

    def _role(self, match: re.Match, scope: Any) -> str:
        _kind, tilde, target = match.groups()
        target = " ".join(target.split())  # a role broken over two lines
        shown = target.rsplit(".", 1)[-1] if tilde else target
        identifier = self._target(target, scope)
        return (f'<autoref identifier="{html.escape(identifier)}" optional>'
                f"<code>{html.escape(shown)}</code></autoref>")

    # ------------------------------------------------------------ block forms
    @staticmethod
    def _literal_blocks(lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            stripped = line.rstrip()
            if stripped.endswith("::") and not stripped.lstrip().startswith(".."):
                # The paragraph's own indentation, and whether it sits in a list item.
                j = len(out) - 1
                while j >= 0 and out[j].strip() and not out[j].lstrip().startswith(("* ", "- ")):
                    j -= 1
                in_list = j >= 0 and out[j].lstrip().startswith(("* ", "- "))
                text = stripped[:-2].rstrip()
                out.append(text + ":" if text and not text.endswith(" ") else text)
                base = len(line) - len(line.lstrip())
                k = i + 1
                while k < len(lines) and not lines[k].strip():
                    k += 1
                block: list[str] = []
                while k < len(lines) and (not lines[k].strip() or
                                          len(lines[k]) - len(lines[k].lstrip()) > base):
                    block.append(lines[k])
                    k += 1
                while block and not block[-1].strip():
                    block.pop()
                if block:
                    indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
                    pad = " " * (4 if in_list else base)
                    out.append("")
                    out.append(pad + "```")
                    out.extend(pad + b[indent:] if b.strip() else "" for b in block)
                    out.append(pad + "```")
                    out.append("")
                i = k
                continue
            out.append(line)
            i += 1
        return out

    @staticmethod
    def _tables(lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(lines):
            rule = _RULE.match(lines[i])
            if not rule:
                out.append(lines[i])
                i += 1
                continue
            # Column starts from the first rule; rows until the third rule.
            spans = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[i])]
            rows: list[list[str]] = []
            rules = 1
            i += 1
            while i < len(lines) and rules < 3:
                if _RULE.match(lines[i]):
                    rules += 1
                    if rules == 2:
                        rows.append(None)  # the header separator
                elif lines[i].strip():
                    line = lines[i].ljust(spans[-1][1])
                    cells = [line[start:(spans[c + 1][0] if c + 1 < len(spans) else None)]
                             .strip() for c, (start, _) in enumerate(spans)]
                    if rows and rows[-1] is not None and not cells[0]:
                        rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
                    else:
                        rows.append(cells)
                i += 1
            indent = rule.group(1)
            for row in rows:
                if row is None:
                    out.append(indent + "|" + "|".join("---" for _ in spans) + "|")
                else:
                    out.append(indent + "| " + " | ".join(row) + " |")
        return out

    @staticmethod
    def _shared_entries(lines: list[str]) -> list[str]:
        """``a, b: text`` in an Args/Attributes section: one entry per name, each with
        the whole description (Google style has one name per entry)."""
        out: list[str] = []
        section_indent = None
        i = 0
        while i < len(lines):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            header = _SECTION.match(line)
            if header:
                section_indent = len(header.group(1))
            elif line.strip() and section_indent is not None and indent <= section_indent:
                section_indent = None
            shared = _SHARED.match(line) if section_indent is not None else None
            if shared and indent == section_indent + 4:
                body = [line]
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    body.append(lines[i])
                    i += 1
                while len(body) > 1 and not body[-1].strip():
                    i -= 1
                    body.pop()
                pad, names, kind, rest = shared.groups()
                for name in names.split(","):
                    out.append(f"{pad}{name.strip()}{kind or ''}:{rest}")
                    out.extend(body[1:])
                continue
            out.append(line)
            i += 1
        return out

    @staticmethod
    def _lists(lines: list[str]) -> list[str]:
        """Bullet lists as Python-Markdown reads them: a blank line before the first
        item, and an item's continuation indented by 4 (docstrings indent by 2, which
        Markdown accepts only for a paragraph's own lines)."""
        out: list[str] = []
        item_indent = None  # the marker's indentation while inside an item
        loose = False  # the current item has a blank line in it
        in_fence = False
        for line in lines:
            stripped = line.strip()
            indent = len(line) - len(line.lstrip())
            if stripped.startswith("```"):
                in_fence = not in_fence
            item = None if in_fence else _ITEM.match(line)
            if item:
                # A blank line before the list, and between items when the one before
                # held several blocks (Markdown would read this marker as its text).
                if out and out[-1].strip() and (item_indent is None or loose):
                    out.append("")
                item_indent, loose = indent, False
                out.append(line)
                continue
            if item_indent is not None and not stripped:
                loose = True
            if item_indent is not None and stripped and not in_fence \
                    and not stripped.startswith("```") and indent <= item_indent:
                item_indent = None  # back at the list's level: the list has ended
            if item_indent is not None and stripped and indent == item_indent + 2:
                line = "  " + line
            out.append(line)
        return out

    @staticmethod
    def _doctests(lines: list[str]) -> list[str]:
        """``>>>`` sessions (with their output, up to a blank line) as ``pycon`` fences;
        Markdown would read the prompts as quotes."""
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.lstrip().startswith(">>>"):
                out.append(line)
                i += 1
                continue
            pad = line[:len(line) - len(line.lstrip())]
            previous = out[-1] if out else ""
            header = re.match(r"^(\s*)[A-Z][\w ]*:\s*$", previous)  # a section title
            if previous.strip() and not (header and len(header.group(1)) < len(pad)):
                out.append("")
            out.append(pad + "```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(pad + lines[i][len(pad):] if lines[i].startswith(pad)
                           else lines[i])
                i += 1
            out.append(pad + "```")
        return out

    def convert(self, text: str, scope: Any) -> str:
        lines = self._doctests(self._shared_entries(text.split("\n")))
        lines = self._lists(self._tables(self._literal_blocks(lines)))
        text = "\n".join(lines)
        return _ROLE.sub(lambda m: self._role(m, scope), text)
