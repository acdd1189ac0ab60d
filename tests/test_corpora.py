"""Corpus cleaning (issue 14): binaries carried as text in 20NG posts must not become words
(the demo showed two topics made of uuencoded fragments)."""
from __future__ import annotations

import base64
import binascii
import re

import numpy as np
import pytest

from streamtopics.corpora import NEWSGROUPS_ARCHIVE, find_archive, load_20newsgroups, strip_encoded_blocks
from streamtopics.text import Tokenizer

PROSE = ("Subject: Re: printer driver for the LZR1260\n"
         "In article <1993Apr5.123456.789@cs.example.edu> someone writes:\n"
         "> Does anybody have the new driver?  It prints garbage on my laser printer.\n"
         "Here it is, uuencoded.  Mail me at driver.fan@ftp.example.com if it fails.\n"
         "THE DRIVER IS PROVIDED AS IS WITHOUT ANY WARRANTY OF MERCHANTABILITY.\n")


def _uu_block(data: bytes, name: str = "1260wn31.exe") -> str:
    lines = [f"begin 644 {name}"]
    for i in range(0, len(data), 45):
        lines.append(binascii.b2a_uu(data[i:i + 45], backtick=True).decode("ascii").rstrip("\n"))
    lines += ["`", "end"]
    return "\n".join(lines)


def _mime_base64(data: bytes) -> str:
    return ("--boundary42\nContent-Type: application/octet-stream; name=\"setup.zip\"\n"
            "Content-Transfer-Encoding: base64\n\n" + base64.encodebytes(data).decode("ascii") + "--boundary42--")


def _words(text: str) -> set[str]:
    return set(Tokenizer(stopwords="none")(text))


def test_uuencoded_and_base64_blocks_leave_no_junk_tokens():
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()
    multipart_tail = "\n".join(_uu_block(blob[:900]).split("\n")[1:12])  # part 2/3 of a post: no begin line
    post = "\n".join([PROSE, "---- cut here ----", _uu_block(blob), "---- cut here ----",
                      "and the setup kit:", _mime_base64(blob[::-1]), multipart_tail,
                      "-- \nClive, Perth, Western Australia"])
    before = _words(post)
    cleaned = strip_encoded_blocks(post)
    after = _words(cleaned)
    assert after == _words(PROSE + "---- cut here ---- cut here ---- and the setup kit:\n--boundary42\n"
                           "Content-Type: application/octet-stream; name=\"setup.zip\"\n"
                           "Content-Transfer-Encoding: base64\n--boundary42--\n-- \nClive, Perth, Western Australia")
    assert len(before) > len(after) + 200  # the blocks did produce junk words before cleaning
    # no line of the encoded data survives, the prose does, line for line
    assert "begin 644" not in cleaned and not re.search(r"^M.{60}$", cleaned, re.M)
    assert PROSE.rstrip("\n") in cleaned


def test_prose_and_single_long_tokens_are_left_alone():
    text = ("MIME-Version: 1.0 is not a block.\n"
            "See ftp://ftp.uu.net/pub/archiving/zip/MSDOS/unzip50p1.zip for the sources\n"
            "MAKE SURE THE CONFIGURATION FILE IS WRITTEN BEFORE YOU RESTART THE DAEMON PROCESS\n"
            "MANY PEOPLE ASKED WHETHER THE DRIVER WORKS WITH THE NEW SERIES OF LASER PRINTERS\n"
            "MOST OF THEM WILL, EXCEPT THE OLDEST MODELS THAT NEED A FIRMWARE UPGRADE FIRST!!\n"
            "QmFzZTY0IGluIGEgc2luZ2xlIGxpbmUgaXMganVzdCBhIHdvcmQ=\n"
            "begin the meeting at ten, end it at noon\n")
    assert strip_encoded_blocks(text) == text


@pytest.mark.skipif(find_archive(NEWSGROUPS_ARCHIVE) is None, reason="20NG archive not in ../shared/data")
def test_20ng_loader_strips_the_uuencoded_windows_binaries():
    docs = {d.id: d.text for d in load_20newsgroups("train")}
    post = docs["train/comp.os.ms-windows.misc/9542"]  # a uuencoded printer driver
    assert "begin 644" not in post and "Dataproducts" in post
    assert not re.search(r"^M[\x20-\x60]{60}$", post, re.M)
