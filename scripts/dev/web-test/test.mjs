// Opens the web viewer in headless Chromium and checks that the page starts without console
// errors, that a trace given in the address loads and its timeline is drawn, that a broken
// file shows an error while the app stays usable, that a file on its way shows as loading and
// then opens beside the first, and takes a screenshot.
//
//   node test.mjs http://127.0.0.1:8765/ out.png
import { chromium } from "playwright-core";
import { checkHealthy } from "./chromium.mjs";

const [base, shot] = process.argv.slice(2);
if (!base || !shot) {
  console.error("usage: node test.mjs BASE_URL SCREENSHOT.png");
  process.exit(2);
}

// The flags the machine notes ask for: no sandbox as root, no GPU, and nothing that reaches
// out to the network; SwiftShader gives WebGL without a GPU.
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-swiftshader",
    "--use-angle=swiftshader",
  ],
});

const failures = [];
const check = (ok, message) => {
  if (!ok) failures.push(message);
  console.log(`${ok ? "ok  " : "FAIL"} ${message}`);
};

try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 860 } });
  const errors = [];
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));

  await page.goto(`${base}?open=traces/broken.pickle&open=traces/seeds.pickle`);
  const status = async () => JSON.parse(await page.evaluate(() => (window.cachalot ? window.cachalot.status() : "null")));
  await page.waitForFunction(
    () => {
      if (!window.cachalot) return false;
      const s = JSON.parse(window.cachalot.status());
      return s && s.tabs.length > 0 && s.tabs.every((t) => t.timeline_drawn) && s.loading === 0;
    },
    null,
    { timeout: 120000 },
  );
  // Let a few more frames render before the picture.
  await page.waitForTimeout(1500);
  const s = await status();
  console.log(JSON.stringify(s));
  check(s.tabs.length === 1 && s.tabs[0].name === "seeds.pickle", "seeds.pickle opened as the only run");
  check(s.tabs[0].entries === 60, `the trace has its 60 entries (${s.tabs[0].entries})`);
  check(s.tabs[0].verified, "its rebuilt end state matches the pickle's segments");
  check(s.notices.some((n) => n.startsWith("broken.pickle")), "the broken file is reported in the UI");
  const png = await page.screenshot({ path: shot });
  check(png.length > 30000, `the screenshot shows a drawn page (${png.length} bytes)`);
  // Opening another file from a script, as the Open button does: it shows as loading (a
  // progress bar) from the moment it is asked for, and opens beside the first without a reload.
  const loadingNow = await page.evaluate(() => {
    window.cachalot.open_url("traces/seeds.pickle");
    return JSON.parse(window.cachalot.status()).loading;
  });
  check(loadingNow === 1, `a file on its way shows as loading (${loadingNow})`);
  await page.waitForFunction(
    () => {
      const s = JSON.parse(window.cachalot.status());
      return s.tabs.length === 2 && s.loading === 0 && s.tabs.every((t) => t.timeline_drawn);
    },
    null,
    { timeout: 120000 },
  );
  const both = await status();
  check(both.tabs.length === 2 && both.tabs[1].entries === 60 && both.tabs[1].verified, "it opens as a second run, verified");
  await checkHealthy(page, errors, check);
} catch (error) {
  failures.push(String(error));
  console.log(`FAIL ${error}`);
} finally {
  await browser.close();
}

console.log(`${failures.length === 0 ? 1 : 0} passed, ${failures.length === 0 ? 0 : 1} failed`);
process.exit(failures.length === 0 ? 0 : 1);
