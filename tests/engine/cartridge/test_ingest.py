"""Reading attached documents: each kind's text, and one clear error per kind of bad file."""

import pytest

from engine.cartridge import ingest
from engine.cartridge.ingest import read_document
from engine.errors import (BinaryDocument, DocumentTooLarge, DocumentUnreadable, EmptyDocument,
                           EncryptedDocument, ImageOnlyDocument)


def _pdf(path, page_texts, password=None):
    """A PDF whose pages show `page_texts` (None: a page with no text layer) in Helvetica."""
    from pypdf import PdfWriter
    from pypdf.generic import ContentStream, DictionaryObject, NameObject

    writer = PdfWriter()
    for text in page_texts:
        page = writer.add_blank_page(612, 792)
        if text is None:
            continue
        font = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                                 NameObject("/Subtype"): NameObject("/Type1"),
                                 NameObject("/BaseFont"): NameObject("/Helvetica")})
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject(
            {NameObject("/F1"): writer._add_object(font)})})
        stream = ContentStream(None, writer)
        stream.set_data(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
    if password:
        writer.encrypt(password, algorithm="RC4-128")
    with open(path, "wb") as f:
        writer.write(f)


def test_text_markdown_and_code_read_as_they_are(tmp_path):
    for name, body in [("notes.txt", "plain words\nsecond line"), ("README.md", "# Title\n\n- item"),
                       ("main.py", "def f():\n    return 1\n")]:
        (tmp_path / name).write_text(body.replace("\n", "\r\n"), encoding="utf-8", newline="")
        doc = read_document(tmp_path / name)
        assert (doc.name, doc.kind, doc.text) == (name, "text", body)


def test_a_text_in_another_encoding_is_detected(tmp_path):
    text = "Le café de la gare est fermé. " * 20 + "Réouverture à l'été, après les travaux."
    (tmp_path / "latin1.txt").write_bytes(text.encode("cp1252"))  # not valid UTF-8
    assert read_document(tmp_path / "latin1.txt").text == text
    (tmp_path / "utf16.txt").write_bytes(text.encode("utf-16"))  # with a BOM, and NUL bytes
    assert read_document(tmp_path / "utf16.txt").text == text


def test_html_reads_as_the_text_a_browser_shows(tmp_path):
    (tmp_path / "page.html").write_text(
        "<!doctype html><html><head><title>T</title><style>p {color: red}</style></head><body>"
        "<h1>Heading</h1><p>First &amp; <b>bold</b>\n   paragraph.</p><script>var x = 1;</script>"
        "<ul><li>one</li><li>two</li></ul><pre>def f():\n    return 1</pre></body></html>")
    assert read_document(tmp_path / "page.html").text == \
        "Heading\nFirst & bold paragraph.\none\ntwo\ndef f():\n    return 1"


def test_pdf_pages_are_read_in_order(tmp_path):
    _pdf(tmp_path / "doc.pdf", ["The first page.", None, "The third page."])
    doc = read_document(tmp_path / "doc.pdf")
    assert doc.kind == "pdf" and doc.text == "The first page.\n\nThe third page."


def test_docx_paragraphs_and_tables_are_read(tmp_path):
    import docx

    d = docx.Document()
    d.add_paragraph("A paragraph.")
    table = d.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "left", "right"
    d.save(tmp_path / "report.docx")
    doc = read_document(tmp_path / "report.docx")
    assert doc.kind == "docx" and doc.text == "A paragraph.\nleft\tright"


@pytest.mark.parametrize("make, error, words", [
    (lambda p: _pdf(p / "x.pdf", ["secret"], password="pw"), EncryptedDocument, "password-protected"),
    (lambda p: _pdf(p / "x.pdf", [None, None]), ImageOnlyDocument, "no text layer"),
    (lambda p: (p / "x.pdf").write_bytes(b"%PDF-1.7\n garbage"), DocumentUnreadable, "damaged PDF"),
    (lambda p: (p / "x.docx").write_bytes(b"PK\x03\x04 not a zip"), DocumentUnreadable, "damaged DOCX"),
    (lambda p: (p / "x.bin").write_bytes(bytes(range(256)) * 8), BinaryDocument, "binary"),
    (lambda p: (p / "x.txt").write_bytes(b""), EmptyDocument, "zero-byte"),
    (lambda p: (p / "x.txt").write_text(" \n\t\n"), EmptyDocument, "no text"),
    (lambda p: (p / "x.html").write_text("<html><script>only()</script></html>"), EmptyDocument, "no text"),
    (lambda p: None, DocumentUnreadable, "cannot read"),
])
def test_a_bad_file_gets_its_own_error_naming_it(tmp_path, make, error, words):
    make(tmp_path)
    path = next(tmp_path.iterdir(), tmp_path / "missing.txt")
    with pytest.raises(error, match=words) as e:
        read_document(path)
    assert str(path) in str(e.value)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(ingest, "MAX_DOCUMENT_BYTES", 1000)
    (tmp_path / "big.txt").write_text("a" * 1001)
    with pytest.raises(DocumentTooLarge, match="big.txt"):
        read_document(tmp_path / "big.txt")
