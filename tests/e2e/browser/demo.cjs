// Drives Debian's chromium (headless, through playwright-core) against the
// demo page: clicks "Send 10 at once", waits for the ten squares and the
// bucket picture, saves a screenshot, and prints what it saw as one JSON line.
//
//   node demo.cjs http://127.0.0.1:PORT/ /path/to/demo.png
//
// Exit 0 when the page was driven (the C++ test judges the numbers), 1 on any error.
"use strict";
const { chromium } = require("playwright-core");

async function main() {
  const [url, screenshot] = process.argv.slice(2);
  if (!url || !screenshot) throw new Error("usage: node demo.cjs URL SCREENSHOT.png");
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
    // The bucket picture follows: the state endpoint says the bucket is empty.
    await page.waitForFunction(
      () => document.getElementById("bucket-text").dataset.remaining === "0",
      null, { timeout: 15000 });
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
