// The two screens a visitor of the web page sees first, checked by their screenshots in headless
// Chromium (WebGPU on its bundled SwiftShader where there is no GPU):
//
// - the first screen (no file, no run): the welcome text shows, and nothing is over it (the
//   "Run on this GPU (WebGPU)" window opens only when asked for); the adapter has a name;
// - asked for, the window opens, and it closes when the run it starts starts;
// - the screen after a `seeds` run on the page's WebGPU shows what the run did, with nothing over
//   it: the timeline spans the whole run (its last entries drawn at the right edge), the cursor
//   is at the run's peak and the segment map shows that moment's blocks;
// - an out-of-memory error of a page run names the device it ran on, not PyTorch's "GPU 0".
//
// Writes OUT_DIR/web-first.png, web-gpu-window.png, web-after-seeds.png and web-oom.png.
// With CACHALOT_REQUIRE_GPU=1 a page without a WebGPU adapter fails; otherwise the run's checks
// are reported as skipped (never counted as passed).
//
//   node screens.mjs http://127.0.0.1:8765/ OUT_DIR
import { checkHealthy, launchChromium, openViewer } from "./chromium.mjs";

const [base, outDir] = process.argv.slice(2);
if (!base || !outDir) {
  console.error("usage: node screens.mjs BASE_URL OUT_DIR");
  process.exit(2);
}
const requireGpu = (process.env.CACHALOT_REQUIRE_GPU || "0") !== "0";

const failures = [];
const check = (ok, message) => {
  if (!ok) failures.push(message);
  console.log(`${ok ? "ok  " : "FAIL"} ${message}`);
};

// The viewer's colours (viewer/src/style.rs): the allocated bytes' line and blocks, the
// reserved bytes' line.
const BLUE = [66, 133, 244];
const GREEN = [98, 190, 110];

// Counts, in `rect` ([left, top, right, bottom] in CSS pixels) of a screenshot, the pixels near
// each of `colours` and those that differ from `background`; the page's own image decoder reads
// the PNG.
const pixels = (page, png, rect, colours, background) =>
  page.evaluate(
    async ({ b64, rect, colours, background }) => {
      const blob = await (await fetch(`data:image/png;base64,${b64}`)).blob();
      const bitmap = await createImageBitmap(blob);
      const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
      const context = canvas.getContext("2d");
      context.drawImage(bitmap, 0, 0);
      const [x0, y0, x1, y1] = rect.map(Math.round);
      const data = context.getImageData(x0, y0, Math.max(1, x1 - x0), Math.max(1, y1 - y0)).data;
      const near = (i, c, tolerance) =>
        Math.abs(data[i] - c[0]) <= tolerance && Math.abs(data[i + 1] - c[1]) <= tolerance && Math.abs(data[i + 2] - c[2]) <= tolerance;
      const counts = colours.map(() => 0);
      let other = 0;
      for (let i = 0; i < data.length; i += 4) {
        colours.forEach((c, k) => {
          if (near(i, c, 30)) counts[k] += 1;
        });
        if (!near(i, background, 6)) other += 1;
      }
      return { counts, other, total: data.length / 4 };
    },
    { b64: png.toString("base64"), rect, colours, background },
  );

const browser = await launchChromium();
try {
  const { page, errors } = await openViewer(browser, base);
  const status = async () => JSON.parse(await page.evaluate(() => window.cachalot.status()));
  const gpu = async () => JSON.parse(await page.evaluate(() => window.cachalot.gpu_status()));
  // A few frames after the adapter's answer, as a visitor would see the page.
  await page.waitForTimeout(1000);

  // The first screen.
  const first = await page.screenshot({ path: `${outDir}/web-first.png` });
  const background = await page.evaluate(async (b64) => {
    const bitmap = await createImageBitmap(await (await fetch(`data:image/png;base64,${b64}`)).blob());
    const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
    const context = canvas.getContext("2d");
    context.drawImage(bitmap, 0, 0);
    // Below the top bar, at the left edge: the central panel's colour.
    return Array.from(context.getImageData(4, 400, 1, 1).data.slice(0, 3));
  }, first.toString("base64"));
  const adapter = (await gpu()).adapter;
  console.log(`adapter: ${JSON.stringify(adapter)}`);
  check((await gpu()).window_open === false, "first screen: the WebGPU window is closed until asked for");
  check((await status()).tabs.length === 0, "first screen: no run is open");
  // Where the window used to open by itself (its default place), the page shows only its panel.
  const corner = await pixels(page, first, [12, 60, 380, 420], [], background);
  check(corner.other === 0, `first screen: nothing over the page where the window opened (${corner.other} pixels differ)`);
  const welcome = await pixels(page, first, [250, 60, 1150, 260], [], background);
  check(welcome.other > 500, `first screen: the welcome text shows (${welcome.other} pixels of text and buttons)`);

  if (adapter.state !== "ready") {
    check(!requireGpu, `a WebGPU adapter (CACHALOT_REQUIRE_GPU=1): ${adapter.why}`);
    console.log("SKIP the run's screens: no WebGPU adapter, and CACHALOT_REQUIRE_GPU is unset");
  } else {
    check(!/^\s*\(/.test(adapter.description), `the adapter has a name: "${adapter.description.split(" (")[0]}"`);

    // Asked for, the window opens; the run it starts closes it.
    await page.evaluate(() => window.cachalot.show_gpu_window());
    await page.waitForTimeout(500);
    check((await gpu()).window_open === true, "the window opens when asked for");
    await page.screenshot({ path: `${outDir}/web-gpu-window.png` });
    await page.evaluate(() => window.cachalot.run_on_gpu(JSON.stringify({ experiment: "seeds", backend: "webgpu", budget_mib: 2048 })));
    check((await gpu()).window_open === false, "the window closes when the run starts");
    await page.waitForFunction(
      () => {
        const s = JSON.parse(window.cachalot.status());
        const g = JSON.parse(window.cachalot.gpu_status());
        return g.run && !g.run.running && s.tabs.length === 1 && !s.tabs[0].live;
      },
      null,
      { timeout: 400000, polling: 100 },
    );
    await page.waitForTimeout(1500);
    const after = await page.screenshot({ path: `${outDir}/web-after-seeds.png` });
    const s = await status();
    const tab = s.tabs[0];
    console.log(`after seeds: ${JSON.stringify(tab)}`);
    check((await gpu()).run.result.record.error === null, "seeds on WebGPU finished");
    check((await gpu()).window_open === false, "after the run: the window is closed");
    check(tab.entries === 60 && tab.verified, `after the run: its 60 entries, end state verified (${tab.entries})`);
    const [left, right] = tab.timeline_entries;
    check(left <= 0 && right >= tab.entries, `after the run: the timeline spans the whole run (entries ${left}..${right} of ${tab.entries})`);
    check(tab.cursor < tab.entries && tab.segments_at_cursor > 0, `after the run: the cursor at the peak (${tab.cursor}), ${tab.segments_at_cursor} segments in the map`);
    const [x0, y0, x1, y1] = tab.timeline_area;
    const plot = await pixels(page, after, [x0, y0, x1, y1], [GREEN, BLUE], background);
    check(plot.counts[0] > 300 && plot.counts[1] > 300, `after the run: the timeline draws reserved and allocated (${plot.counts} pixels)`);
    const edge = await pixels(page, after, [x1 - (x1 - x0) / 30, y0, x1 - 1, y1], [GREEN, BLUE], background);
    check(edge.counts[0] + edge.counts[1] > 10, `after the run: its last entries are drawn at the plot's right edge (${edge.counts} pixels)`);
    // The segment map: under the timeline's axis and the map's two rows of controls, above the
    // notices at the bottom.
    const map = await pixels(page, after, [260, y1 + 90, 1390, 820], [BLUE], background);
    check(map.counts[0] > 5000, `after the run: the segment map shows the peak's blocks (${map.counts[0]} blue pixels)`);

    // Past a 16 MiB budget: the allocator's out-of-memory error, naming the page's device.
    await page.evaluate(() => window.cachalot.run_on_gpu(JSON.stringify({ experiment: "seeds", backend: "webgpu", budget_mib: 16 })));
    await page.waitForFunction(
      () => {
        const s = JSON.parse(window.cachalot.status());
        return s.tabs.length === 2 && !s.tabs[1].live;
      },
      null,
      { timeout: 400000, polling: 100 },
    );
    await page.waitForTimeout(1000);
    await page.screenshot({ path: `${outDir}/web-oom.png` });
    const oom = (await status()).notices.find((n) => n.includes("out of memory")) || "";
    check(oom.includes("out of memory on WebGPU (") && !/GPU \d+ has|CUDA out of memory/.test(oom), `the OOM names the page's device: ${oom.slice(0, 200)}`);
  }
  await checkHealthy(page, errors, check);
} catch (error) {
  failures.push(String(error));
  console.log(`FAIL ${error}`);
} finally {
  await browser.close();
}

console.log(`screens: ${failures.length === 0 ? "passed" : `${failures.length} failed`}`);
process.exit(failures.length === 0 ? 0 : 1);
