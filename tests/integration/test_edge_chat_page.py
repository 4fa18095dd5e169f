"""The chat page in a real headless browser (Debian's chromium driven by Playwright): text
appears token by token, and Stop ends the answer through a cancel on the bus."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright

from tests.integration.harness import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Records the assistant bubble's text length at every DOM change of the conversation.
RECORD_LENGTHS = """() => {
  window.twLengths = [];
  const log = document.getElementById("log");
  new MutationObserver(() => {
    const bubbles = log.querySelectorAll(".msg.assistant");
    if (bubbles.length) window.twLengths.push(bubbles[bubbles.length - 1].textContent.length);
  }).observe(log, { childList: true, characterData: true, subtree: true });
}"""


ANSWER_HEIGHT = """() => {
  const bubbles = document.querySelectorAll(".msg.assistant");
  return bubbles[bubbles.length - 1].getBoundingClientRect().height;
}"""


async def _status(page: Page) -> str:
    return (await page.text_content("#status")) or ""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
async def test_chat_page_streams_tokens_and_stop_ends_the_answer(stack: Stack) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = await browser.new_page()
            # Long enough that Stop lands mid-answer: 1,500 tokens, EOS ignored.
            await page.goto(stack.url() + "/chat?max_tokens=1500&ignore_eos=1")
            await page.evaluate(RECORD_LENGTHS)
            await page.fill("#prompt", "What does the function return?")
            await page.click("#send")
            await page.wait_for_function("() => window.twLengths.filter(n => n > 0).length >= 6")
            await page.screenshot(path=str(ARTIFACTS / "edge-chat-page-streaming.png"))
            assert await _status(page) == "streaming"
            # The controls hold still while the answer grows (a Stop that runs away from
            # the pointer cannot be clicked): wait for the answer to take another line.
            stop_box = await page.locator("#stop").bounding_box()
            height = await page.evaluate(ANSWER_HEIGHT)
            await page.wait_for_function(f"() => ({ANSWER_HEIGHT})() > {height}")
            assert await page.locator("#stop").bounding_box() == stop_box
            await page.click("#stop")
            await page.wait_for_function(
                "() => document.getElementById('status').textContent === 'stopped'",
                timeout=30_000,
            )
            await page.screenshot(path=str(ARTIFACTS / "edge-chat-page-stopped.png"))
            lengths: list[int] = await page.evaluate("() => window.twLengths")
            text = (await page.text_content(".msg.assistant")) or ""
            stopped = await page.get_attribute(".msg.assistant", "class")
            await page.wait_for_timeout(300)
            assert (await page.text_content(".msg.assistant")) == text  # nothing after stop
        finally:
            await browser.close()
    grown = [n for n in lengths if n > 0]
    assert grown == sorted(grown) and len(set(grown)) >= 5  # appeared piece by piece
    assert 0 < len(text) == grown[-1]
    assert stopped is not None and "stopped" in stopped
