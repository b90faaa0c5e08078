// The least time any page can take to open a file in this browser on this machine: what the
// browser itself costs before a page's own code does anything. BENCHMARKS.md §10 sets it against
// the native viewer's whole open, to say what the page's ≤ 2× goal leaves for the page's work.
//
// In a page of the same origin with no script of its own, for each file (median of RUNS):
//   - fetch: `fetch(url)`, its body as an ArrayBuffer, copied out once (as the viewer's
//     `Uint8Array::to_vec` does), from `cachalot serve`;
//   - fetch + frame: then the next animation frame, the earliest a page can draw what it read;
//   - file + frame: the same bytes from a local file (an <input type=file>, as the viewer's file
//     picker reads them with `File.arrayBuffer`), then the next animation frame.
//
//   [RUNS=7] [SETTLE=2000] node floor.mjs BASE_URL FILE_URL LOCAL_PATH
import { launchChromium } from "./chromium.mjs";

const [base, fileUrl, localPath] = process.argv.slice(2);
if (!base || !fileUrl || !localPath) {
  console.error("usage: node floor.mjs BASE_URL FILE_URL LOCAL_PATH");
  process.exit(2);
}
const runs = Number(process.env.RUNS || 7);
const settle = Number(process.env.SETTLE ?? 2000);
const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
};

const browser = await launchChromium();
try {
  const fetched = [];
  const fetchedFramed = [];
  const filed = [];
  for (let i = 0; i < runs; i++) {
    const page = await browser.newPage();
    // Any address of the server's origin will do (a 404 page has no script): the fetch is then
    // same-origin, as the viewer's is.
    await page.goto(new URL("floor-blank", base).href);
    await page.waitForTimeout(settle);
    const ms = await page.evaluate(async (url) => {
      const frame = () => new Promise((done) => requestAnimationFrame(done));
      const started = performance.now();
      const response = await fetch(url);
      const bytes = new Uint8Array(await response.arrayBuffer()).slice();
      const read = performance.now();
      await frame();
      return { fetch: read - started, framed: performance.now() - started, bytes: bytes.length };
    }, new URL(fileUrl, base).href);
    fetched.push(ms.fetch);
    fetchedFramed.push(ms.framed);

    await page.evaluate(() => {
      const input = document.createElement("input");
      input.type = "file";
      input.id = "floor-input";
      document.body.appendChild(input);
      window.floorResult = new Promise((done) => {
        input.addEventListener("change", async () => {
          const started = performance.now();
          const bytes = new Uint8Array(await input.files[0].arrayBuffer()).slice();
          await new Promise((frame) => requestAnimationFrame(frame));
          done({ framed: performance.now() - started, bytes: bytes.length });
        });
      });
    });
    await page.setInputFiles("#floor-input", localPath);
    const local = await page.evaluate(() => window.floorResult);
    filed.push(local.framed);
    await page.close();
  }
  const round = (x) => Math.round(x * 10) / 10;
  console.log(
    JSON.stringify({
      file: fileUrl,
      runs,
      fetch_ms: round(median(fetched)),
      fetch_then_frame_ms: round(median(fetchedFramed)),
      local_file_then_frame_ms: round(median(filed)),
      all: { fetch: fetched.map(round), fetch_then_frame: fetchedFramed.map(round), local_file_then_frame: filed.map(round) },
    }),
  );
} finally {
  await browser.close();
}
