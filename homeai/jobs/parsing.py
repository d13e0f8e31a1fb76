"""Text out of the files a household keeps: plain text, Markdown, HTML (tags stripped), PDF (pypdf).

Functions take the file's bytes (read once, hashed and parsed from the same buffer, so the stored hash
always belongs to the text that was indexed).
"""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser
from pathlib import Path

TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown"})
HTML_SUFFIXES = frozenset({".html", ".htm"})
PDF_SUFFIXES = frozenset({".pdf"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


class ParseError(ValueError):
    """The file cannot be read as text (a damaged or encrypted PDF, say)."""


def is_supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def extract_text(path: Path, data: bytes) -> str:
    """The text of a file whose content is ``data``; the suffix of ``path`` picks the parser. NUL characters
    are dropped: PostgreSQL's text cannot hold them, and one such file failed every run of its job."""
    suffix = path.suffix.lower()
    if suffix in HTML_SUFFIXES:
        text = html_text(decode(data))
    elif suffix in PDF_SUFFIXES:
        text = pdf_text(data)
    elif suffix in TEXT_SUFFIXES:
        text = decode(data)
    else:
        raise ParseError(f"unsupported file type {suffix!r}")
    return text.replace("\x00", "")


def decode(data: bytes) -> str:
    """UTF-8 (a BOM is dropped); bytes that are not UTF-8 become U+FFFD rather than failing the file."""
    return data.decode("utf-8-sig", errors="replace")


class _TextExtractor(HTMLParser):
    """Collects text outside script/style; block elements become line breaks."""

    SKIP = frozenset({"script", "style", "noscript", "template", "head"})
    BLOCKS = frozenset({"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header",
                        "footer", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "title", "hr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skip_depth += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(data)


def html_text(markup: str) -> str:
    """Visible text of an HTML document, whitespace tidied (runs of blanks to one, at most one empty line)."""
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    return tidy("".join(parser.parts))


def pdf_text(data: bytes) -> str:
    """Text of every page, pages separated by a blank line."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise ParseError("the PDF is encrypted")
        return tidy("\n\n".join(page.extract_text() or "" for page in reader.pages))
    except (PdfReadError, ValueError, KeyError, OSError) as e:
        if isinstance(e, ParseError):
            raise
        raise ParseError(f"cannot read the PDF: {e}") from e


def tidy(text: str) -> str:
    text = re.sub(r"[ \t\f\v\r]+", " ", text)
    text = re.sub(r" ?\n ?", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
