"""Text out of .txt, .md, .html (tags, scripts and styles stripped) and .pdf (pypdf)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pdf_helpers import make_pdf

from homeai.jobs.parsing import ParseError, extract_text, html_text, is_supported


def test_plain_text_and_markdown_keep_their_text() -> None:
    assert extract_text(Path("a.txt"), "\ufeffHello wörld\n".encode()) == "Hello wörld\n"
    assert extract_text(Path("a.md"), b"# Title\n\n- item") == "# Title\n\n- item"
    assert extract_text(Path("A.TXT"), b"bad \xff byte") == "bad \ufffd byte"


def test_html_drops_tags_scripts_and_styles() -> None:
    markup = ("<html><head><title>T</title><style>p {color: red}</style></head><body>"
              "<h1>Pasta</h1><p>Boil&nbsp;water &amp; salt.</p><script>alert('x')</script>"
              "<ul><li>one</li><li>two</li></ul></body></html>")
    text = html_text(markup)
    assert "Pasta" in text and "Boil\xa0water & salt." in text and "one\n" in text
    assert "alert" not in text and "color" not in text and "<" not in text
    assert extract_text(Path("x.htm"), markup.encode()) == text


def test_pdf_text_through_pypdf() -> None:
    data = make_pdf(["Invoice 2024 for the garage door", "Total due: 450 EUR"])
    text = extract_text(Path("bill.pdf"), data)
    assert "Invoice 2024 for the garage door" in text and "450 EUR" in text


def test_a_damaged_pdf_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        extract_text(Path("broken.pdf"), b"%PDF-1.4 this is not a pdf")


def test_supported_suffixes() -> None:
    assert all(is_supported(Path(n)) for n in ("a.txt", "b.md", "c.html", "d.HTM", "e.pdf"))
    assert not any(is_supported(Path(n)) for n in ("a.docx", "b.png", "noext"))
