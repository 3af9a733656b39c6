// Drives Debian's chromium (headless, through playwright-core) against the
// demo page: clicks "Send 10 at once", waits for the ten squares and the
// bucket picture, saves a screenshot, and prints what it saw as one JSON line.
//
//   node demo.cjs http://127.0.0.1:PORT/ /path/to/demo.png [--until=empty|described|store-down]
//
// What to wait for after the ten answers: `empty` (the default) the bucket
// reading 0 (a limit that does not refill meanwhile); `described` the page
// having read the limit from /demo/state (a real-time refill may fill the
// bucket again before it is sampled); `store-down` the page's notice that
// /demo/state could not answer.
//
// Exit 0 when the page was driven (the C++ test judges the numbers), 1 on any error.
"use strict";
const { chromium } = require("playwright-core");

async function main() {
  const [url, screenshot, option] = process.argv.slice(2);
  const until = option ? option.replace(/^--until=/, "") : "empty";
  if (!url || !screenshot || !["empty", "described", "store-down"].includes(until)) {
    throw new Error("usage: node demo.cjs URL SCREENSHOT.png [--until=empty|described|store-down]");
  }
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 800, height: 760 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(url, { waitUntil: "load" });
    await page.getByRole("button", { name: "Send 10 at once" }).click();
    await page.waitForFunction(
      () => document.querySelectorAll("#grid .sq").length === 10 &&
            document.querySelectorAll("#grid .sq.pending").length === 0,
      null, { timeout: 15000 });
    const ready = {
      // The bucket picture follows: the state endpoint says the bucket is empty.
      empty: () => document.getElementById("bucket-text").dataset.remaining === "0",
      described: () => !document.getElementById("limit-text").textContent.startsWith("(reading"),
      "store-down": () => document.getElementById("notice").textContent.includes("/demo/state"),
    }[until];
    await page.waitForFunction(ready, null, { timeout: 15000 });
    await page.waitForTimeout(300);  // a few more samples on the chart
    const seen = await page.evaluate(() => {
      const squares = [...document.querySelectorAll("#grid .sq")];
      const canvas = document.getElementById("bucket");
      const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
      let green = 0;  // pixels of the line (#2e7d32)
      for (let i = 0; i < data.length; i += 4) {
        if (Math.abs(data[i] - 0x2e) < 24 && Math.abs(data[i + 1] - 0x7d) < 24 &&
            Math.abs(data[i + 2] - 0x32) < 24 && data[i + 3] > 200) green++;
      }
      return {
        ok: squares.filter((s) => s.classList.contains("ok")).length,
        denied: squares.filter((s) => s.classList.contains("denied")).length,
        degraded: squares.filter((s) => s.classList.contains("degraded")).length,
        limitText: document.getElementById("limit-text").textContent,
        notice: document.getElementById("notice").textContent,
        ids: squares.map((s) => s.id),
        titles: squares.map((s) => s.title),
        remaining: squares.map((s) => s.dataset.remaining),
        bucket: document.getElementById("bucket-text").textContent,
        chartPixels: green,
        buttons: [...document.querySelectorAll("button")].map((b) => b.textContent),
      };
    });
    seen.pageErrors = errors;
    await page.screenshot({ path: screenshot, fullPage: true });
    process.stdout.write(JSON.stringify(seen) + "\n");
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  process.stderr.write(`demo.cjs: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
