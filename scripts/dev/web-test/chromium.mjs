// The one Chromium launch of the page's scripts (webgpu.mjs, bench.mjs, trace-open.mjs,
// screens.mjs), and the viewer opened in it.
//
// Chromium's WebGPU without a GPU: headless mode (Chromium 132 on has only the new one, which
// playwright's `headless` asks for; a "headful" launch with --headless=new gives blank
// screenshots) and the unsafe-WebGPU switch give an adapter on SwiftShader (no system Vulkan is
// needed; VK_DRIVER_FILES is left alone). The page itself draws with WebGL on ANGLE's
// SwiftShader: without `--use-angle=swiftshader` headless Chromium composites in software and
// reads every WebGL frame back on the page's main thread (GLES2::ReadPixels in the commit,
// 0.5-0.8 s per frame of a trace here), which is the browser's setup, not the page's cost.
import { chromium } from "playwright-core";

export const launchChromium = () =>
  chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [
      "--no-sandbox",
      "--enable-unsafe-webgpu",
      "--enable-unsafe-swiftshader",
      "--use-angle=swiftshader",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });

// `page` on the viewer at `base`, once the page's adapter has answered (or said there is none).
export const gotoViewer = async (page, base) => {
  await page.goto(base);
  await page.waitForFunction(
    () => {
      const s = window.cachalot ? JSON.parse(window.cachalot.gpu_status()) : null;
      return s && s.adapter.state !== "pending";
    },
    null,
    { timeout: 120000 },
  );
};

// A new page of `browser` on the viewer at `base`, once the page's adapter has answered (or
// said there is none): the page and the console errors it logs from then on.
export const openViewer = async (browser, base) => {
  const page = await browser.newPage({ viewport: { width: 1400, height: 860 } });
  const errors = [];
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  await gotoViewer(page, base);
  return { page, errors };
};

// The page's health at the end of a script: the app did not panic, and no console error was
// logged on `page` (the `errors` openViewer gathers).
export const checkHealthy = async (page, errors, check) => {
  const panicked = await page.evaluate(() => window.cachalot.has_panicked());
  check(!panicked, "the app did not panic");
  check(errors.length === 0, `no console errors${errors.length ? ": " + errors.join(" | ") : ""}`);
};
