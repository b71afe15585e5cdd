"""An attached document as plain text: text, Markdown and source code (any encoding), HTML (its text),
PDF (pypdf) and DOCX (python-docx).

The kind comes from the file's first bytes where they say (a PDF's `%PDF-`, a DOCX's zip container) and
from its extension otherwise. Every failure is a DocumentError subclass naming the file and what to do:
a missing or damaged file, one over MAX_DOCUMENT_BYTES, an encrypted or image-only PDF, a binary file, a
document without text.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import unicodedata
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import charset_normalizer

from engine.errors import (BinaryDocument, DocumentTooLarge, DocumentUnreadable, EmptyDocument,
                           EncryptedDocument, ImageOnlyDocument)

# A document is read whole into memory and then tokenized: 32 MB of text is millions of tokens already.
MAX_DOCUMENT_BYTES = 32 << 20
# Text may hold a few control characters (form feeds, escape codes in a log); a file where more than
# this share of the characters are controls is not text, whatever encoding decodes it.
_MAX_CONTROL_SHARE = 0.05
_HTML_SUFFIXES = {".html", ".htm", ".xhtml"}


@dataclass(frozen=True)
class Document:
    name: str  # the file's name, for lists and messages
    kind: str  # text | html | pdf | docx
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def read_document(path: str | os.PathLike) -> Document:
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise DocumentTooLarge(f"{path} is {size / 1e6:.0f} MB; documents of up to "
                                   f"{MAX_DOCUMENT_BYTES >> 20} MB are read (split it, or attach a part)")
        data = path.read_bytes()
    except OSError as e:
        raise DocumentUnreadable(f"cannot read the document {path}: {e.strerror or e}") from None
    kind = _kind(path, data)
    text = {"pdf": _pdf_text, "docx": _docx_text, "html": _html_text, "text": _plain_text}[kind](path, data)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise EmptyDocument(f"{path} has no text in it" + (" (a zero-byte file)" if not data else ""))
    return Document(path.name, kind, text)


def _kind(path: Path, data: bytes) -> str:
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data.startswith(b"PK\x03\x04") and path.suffix.lower() == ".docx":
        return "docx"
    head = data[:512].lstrip().lower()
    if path.suffix.lower() in _HTML_SUFFIXES or head.startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


def _plain_text(path: Path, data: bytes) -> str:
    if not data:
        return ""
    if b"\x00" in data[:8192] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 has NULs too
        raise BinaryDocument(f"{path} is a binary file, not text (attach a text, Markdown, code, HTML, PDF "
                             "or DOCX file)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        best = charset_normalizer.from_bytes(data).best()
        if best is None:
            raise BinaryDocument(f"{path} is not text in any encoding Fucina recognizes") from None
        text = str(best)
    controls = sum(1 for c in text if unicodedata.category(c) == "Cc" and c not in "\t\n\r\f")
    if controls > _MAX_CONTROL_SHARE * len(text):
        raise BinaryDocument(f"{path} is a binary file, not text (attach a text, Markdown, code, HTML, PDF "
                             "or DOCX file)")
    return text


class _TextOfHtml(HTMLParser):
    """The text a browser shows: no scripts, styles or head; whitespace collapses to one space except in
    <pre>; block elements start new lines."""

    _SKIP = {"script", "style", "head", "noscript", "template"}
    _BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote",
               "section", "article", "table", "ul", "ol", "hr", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = self._pre = 0

    def handle_starttag(self, tag, attrs):
        self._pre += tag == "pre"
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        self._pre = max(0, self._pre - (tag == "pre"))
        if tag in self._SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skipping:
            if not self._pre:
                data = re.sub(r"\s+", " ", data)
                if not self.parts or self.parts[-1].endswith("\n"):
                    data = data.lstrip()
            self.parts.append(data)


def _html_text(path: Path, data: bytes) -> str:
    parser = _TextOfHtml()
    parser.feed(_plain_text(path, data))
    parser.close()
    lines = (line.rstrip() for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def _pdf_text(path: Path, data: bytes) -> str:
    import pypdf  # loaded only when a PDF is attached
    from pypdf.errors import DependencyError, PyPdfError

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):  # an owner password alone still reads
            raise EncryptedDocument(f"{path} is a password-protected PDF; save an unprotected copy and "
                                    "attach that")
        pages = [page.extract_text() or "" for page in reader.pages]
    except EncryptedDocument:
        raise
    except DependencyError:  # an encryption pypdf reads only with an optional package
        raise EncryptedDocument(f"{path} is an encrypted PDF Fucina cannot open; save an unencrypted copy and "
                                "attach that") from None
    except (PyPdfError, ValueError, KeyError, TypeError, OSError, RecursionError) as e:
        raise DocumentUnreadable(f"{path} is a damaged PDF: {e}") from None
    if pages and not any(p.strip() for p in pages):
        raise ImageOnlyDocument(f"{path} has {len(pages)} page(s) of images and no text layer; run it through "
                                "OCR first and attach the result")
    return "\n\n".join(p.strip() for p in pages if p.strip())


def _docx_text(path: Path, data: bytes) -> str:
    import docx  # python-docx, loaded only when a DOCX is attached
    from docx.opc.exceptions import OpcError

    try:
        doc = docx.Document(io.BytesIO(data))
    except (OpcError, zipfile.BadZipFile, KeyError, ValueError, OSError) as e:
        raise DocumentUnreadable(f"{path} is a damaged DOCX file: {e}") from None
    parts = [p.text for p in doc.paragraphs]
    for table in doc.tables:
        parts += ["\t".join(cell.text for cell in row.cells) for row in table.rows]
    return "\n".join(parts)
