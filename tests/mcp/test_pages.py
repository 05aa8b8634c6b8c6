"""read_file's pages as a pure function: whatever the text and the bound, following `next` from any line gives back
exactly the text, no page is empty while text is left, none is over the bound, and lines are numbered as git numbers
them (LF only: a form feed or a lone CR in a source file made read_file's line N another line than search_code's)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crewwork.mcp.files import count_lines, line_start, text_page

TEXT = st.text(alphabet=st.sampled_from(["a", "é", "☃", "𝄞", "\n", "\r", "\x0c", "\u2028", " "]), max_size=400)


def follow(text: str, first: int, max_bytes: int) -> list[str]:
    total = count_lines(text)
    at: tuple[int, int] | None = (first, 0)
    pages: list[str] = []
    while at is not None:
        page = text_page(text, line_start(text, at[0], total), at[0], total, at[1], max_bytes)
        assert page.content or page.next is None, "an empty page with more to come"
        assert len(page.content.encode()) <= max_bytes
        assert len(pages) <= len(text) + 1, "the pages never got to the end"
        pages.append(page.content)
        at = page.next
    return pages


@settings(max_examples=300, deadline=None)
@given(TEXT, st.integers(min_value=4, max_value=40), st.integers(min_value=1, max_value=30))
def test_following_the_pages_gives_back_the_text_from_any_line(text: str, max_bytes: int, first: int) -> None:
    lines = text.split("\n")
    expected = "\n".join(lines[first - 1 :]) if first <= count_lines(text) else ""
    assert "".join(follow(text, first, max_bytes)) == expected


def test_lines_are_numbered_as_git_numbers_them() -> None:
    text = "one\x0cstill one\rstill one\u2028still one\ntwo\n"
    assert count_lines(text) == 2
    page = text_page(text, line_start(text, 2, 2), 2, 2, 0, 1000)
    assert page.content == "two\n" and page.end_line == 2 and page.next is None
